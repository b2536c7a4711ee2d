"""The OpenAI-compatible HTTP application over one ``fastpar.Engine`` (``fastpar serve``).

``create_app(engine)`` returns the ASGI application (Starlette); ``serve(...)`` (service.py) runs it
with uvicorn. Every prompt of a request becomes one Engine request holding its ``n``
samples, so the HTTP layer adds no batching of its own: the engine's continuous batching
serves all connections, and a prompt's samples decode it once.
The event loop never waits on generation: the engine's worker thread wakes it through a
pipe (``Request.on_update`` with a loop) when a request has new text or has finished.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/embeddings``
(an embeddings engine: ``fastpar serve --embeddings``), ``POST /v1/rerank`` (a reranker's:
``--rerank``), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (docs/server.md).
"""

from __future__ import annotations

try:
    import prometheus_client
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request as HTTPRequest
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
except ImportError as _e:  # pragma: no cover - depends on the installation
    raise ImportError(f"fastpar.server needs the optional server dependencies ({_e.name} is missing): "
                      "pip install 'fastpar[server]'") from _e

import asyncio
import contextlib
import json
import logging
import os
import secrets
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Union

import fastpar
from fastpar import Completion, Engine, Request

from .protocol import RETRY_AFTER_S, APIError, Limits, Parsed, chunk_logprobs, failure, parse, prompt_failure
from .protocol import prompt_tokens, response_body, usage
from .embeddings import answer_embeddings, vector_endpoint
from .reasoning import ThoughtSplit, opens_thought, thinks
from .tools import ToolStream
from .rerank import RERANK_PATHS, answer_rerank

__all__ = ["create_app"]

logger = logging.getLogger("fastpar.server")


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


# -- the application ------------------------------------------------------------------------------

class _Metrics:
    def __init__(self, state: "_State") -> None:
        self.registry = prometheus_client.CollectorRegistry()
        r = self.registry
        self.requests = prometheus_client.Counter(
            "fastpar_requests", "HTTP generation requests by endpoint and outcome", ["endpoint", "outcome"], registry=r)
        self.prompt_tokens = prometheus_client.Counter("fastpar_prompt_tokens", "Prompt tokens of answered requests",
                                                       registry=r)
        self.generated_tokens = prometheus_client.Counter("fastpar_generated_tokens", "Generated tokens", registry=r)
        buckets = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
        self.ttft = prometheus_client.Histogram("fastpar_time_to_first_token_seconds",
                                                "From submission to the first generated token, per sample",
                                                buckets=buckets, registry=r)
        self.latency = prometheus_client.Histogram("fastpar_request_latency_seconds",
                                                   "From receiving a request to its last byte", buckets=buckets,
                                                   registry=r)
        prometheus_client.Gauge("fastpar_queue_depth", "Requests waiting for a slot",
                                registry=r).set_function(lambda: state.stat("n_queued"))
        prometheus_client.Gauge("fastpar_busy_slots", "Slots generating or reading a prompt",
                                registry=r).set_function(lambda: state.stat("n_active"))
        # The prefix cache's own counts: a counter's value is set by a collector, read on scrape.
        for name, doc, field, kind in (
                ("fastpar_prefix_cache_hits", "Prompts that started from a cached prefix", "n_hits", "counter"),
                ("fastpar_prefix_cache_tokens_reused", "Prompt tokens taken from the prefix cache instead of decoded",
                 "n_tokens_reused", "counter"),
                ("fastpar_prefix_cache_bytes", "Host memory the prefix cache holds", "bytes_host", "gauge"),
                ("fastpar_prefix_cache_tokens_held", "Tokens the prefix cache holds, in slots and in host memory",
                 None, "gauge"),
                ("fastpar_prefix_cache_host_copy_seconds", "Time spent copying sequences to host memory and back",
                 "t_host_ms", "counter"),
                ("fastpar_prefix_cache_not_saved", "Sequences left unsaved while saved ones went unused (GPU)",
                 "n_not_saved", "counter")):
            _CacheMetric(r, name, doc, field, kind, state)


class _CacheMetric:
    """One of the prefix cache's counts, read from the engine when /metrics is scraped."""

    def __init__(self, registry, name: str, doc: str, field: Optional[str], kind: str, state: "_State") -> None:
        self.name, self.doc, self.field, self.kind, self.state = name, doc, field, kind, state
        registry.register(self)

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.state.cache_stats()
        if s is None:
            value = 0.0
        elif self.field is None:
            value = float(s.n_tokens_held + s.n_host_tokens)
        else:
            value = float(getattr(s, self.field))
            if self.field.endswith("_ms"):
                value /= 1000.0  # Prometheus counts seconds
        family = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        yield family(self.name, self.doc, value=value)


class _State:
    """The engine (or its loading), the names and the metrics of one application."""

    def __init__(self, engine: Union[Engine, Callable[[], Engine]], model_name: Optional[str],
                 api_key: Optional[str]) -> None:
        self.engine: Optional[Engine] = engine if isinstance(engine, Engine) else None
        self.loader = None if isinstance(engine, Engine) else engine
        self.owned = self.engine is None  # an engine the app loaded is the app's to close
        self.load_error: Optional[BaseException] = None
        self.model_name = model_name
        if self.engine is not None and model_name is None:
            self.model_name = _name_of(self.engine)
        self.api_key = api_key
        self.created = int(time.time())
        self.metrics = _Metrics(self)
        # The requests being answered (a job leaves with its handler) and, once the server
        # stops, a flag that answers new ones 503 (serve's shutdown).
        self.jobs: "weakref.WeakSet[_Job]" = weakref.WeakSet()
        self.stopping = False
        self.limits = Limits()  # create_app's

    def stat(self, name: str) -> float:
        return getattr(self.engine.stats(), name) if self.engine is not None else 0

    def cache_stats(self):
        return self.engine.prefix_cache_stats() if self.engine is not None else None

    def ready(self) -> Engine:
        if self.engine is None:
            why = f"the model failed to load: {self.load_error}" if self.load_error else "the model is loading"
            raise APIError(503, f"not ready: {why}", "server_error", code="model_not_ready",
                             headers={"Retry-After": str(RETRY_AFTER_S)})
        return self.engine

    async def stop(self, timeout: float, force: Callable[[], bool]) -> None:
        """Shutdown, before the server waits for its connections: new requests are answered
        503; those generating get up to ``timeout`` seconds to finish, then are cancelled,
        so that their handlers answer them (503, or a stream's error event) instead of
        being killed mid-answer. ``force()``: stop waiting at once (a second Ctrl-C)."""
        self.stopping = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout

        def running() -> List["_Job"]:
            return [j for j in list(self.jobs) if not j.done()]

        while running() and loop.time() < deadline and not force():
            await asyncio.sleep(0.05)
        left = running()
        if left:
            logger.warning("cancelling %d request(s) still generating after the shutdown timeout (%g s)",
                           len(left), timeout)
        for job in left:
            job.cancel()

    def check_key(self, request: HTTPRequest) -> None:
        if self.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, key = auth.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(key.strip().encode(), self.api_key.encode()):
            raise APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                             "invalid_request_error", code="invalid_api_key")


def _name_of(engine: Engine) -> str:
    return os.path.splitext(os.path.basename(engine.model.path))[0]


async def _wait_disconnect(receive: Callable) -> None:
    """Returns when the client has gone (the request body has been read already)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _json_body(request: HTTPRequest) -> Any:
    # Read up to the server's limit (--max-body-mib), never the whole of a larger body.
    limit = int(request.app.state.fastpar.limits.max_body_mib * (1 << 20))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(400, f"the request body is over this server's {limit} bytes (--max-body-mib)",
                           code="request_too_large")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except ValueError as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from None


def _shutting_down() -> APIError:
    return APIError(503, "the server is shutting down", "server_error", code="shutting_down",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


def _queue_full() -> APIError:
    return APIError(429, "the server's queue is full; retry later", "rate_limit_error", code="queue_full",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


class _Job:
    """The engine requests of one HTTP request: one per prompt, holding its n samples.
    Choice k of the response is sample k % n of prompt k // n."""

    def __init__(self, engine: Engine, req: Parsed, loop: asyncio.AbstractEventLoop, news: asyncio.Event) -> None:
        # Set on the loop when any of the requests has news (on_update with a loop: the
        # engine's thread runs no Python for it).
        self.news = news
        self.requests: List[Request] = []
        self.n = req.n
        params = req.sampling_params()
        try:
            for prompt in req.prompts:
                r = engine.submit(prompt, params)
                self.requests.append(r)
                r.on_update(self.news.set, loop=loop)
        except fastpar.QueueFull:
            self.cancel()
            raise _queue_full() from None
        except fastpar.EngineClosed as e:
            self.cancel()
            raise APIError(503, f"the server is shutting down: {e}", "server_error", code="engine_closed") from None
        except (TypeError, ValueError) as e:
            self.cancel()
            raise APIError(400, str(e), param=req.param) from None

    @property
    def n_choices(self) -> int:
        return len(self.requests) * self.n

    def choice_done(self, k: int) -> bool:
        return self.requests[k // self.n].sample_done(k % self.n)

    def choice_result(self, k: int) -> Completion:
        """Choice k's completion, once it is done."""
        return self.requests[k // self.n].sample_result(k % self.n, 0)

    def cancel(self) -> None:
        for r in self.requests:
            r.cancel()

    def done(self) -> bool:
        return all(r.done() for r in self.requests)

    def completions(self) -> List[Completion]:
        """Every choice's completion, in order, once all are done."""
        return [c for r in self.requests for c in r.completions(0)]

    async def wait(self, gone: "asyncio.Future[None]") -> bool:
        """Waits for news from the engine (or the client leaving); False once it has left."""
        if not gone.done():
            await self.news.wait()
            self.news.clear()
        return not gone.done()


def _sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


_DONE = b"data: [DONE]\n\n"


class _EventStream(StreamingResponse):
    """A streamed response written straight to the server. The request's own disconnect
    watcher (`gone`) ends the events, so the stream needs neither StreamingResponse's task
    group nor its second loop reading the request for a disconnect (a task group and two
    tasks per request, on the event loop that every stream shares)."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await self.stream_response(send)
        except OSError:  # servers of ASGI 2.4 raise it on a send after the client has gone
            pass


class _TextEvents:
    """Events that carry a piece of one choice's text and nothing else, made from a template
    per choice: the bytes `event(index, text)` gives, without encoding the whole event again
    for every piece (at a GPU's rates, encoding events is much of the event loop's work)."""

    _MARK = "\x00fastpar-text\x00"  # control characters: escaped in JSON, never a piece's own
    _MARK_JSON = json.dumps(_MARK).encode()

    def __init__(self, event: Callable[[int, str], bytes]) -> None:
        self.event = event
        self.templates: Dict[int, Tuple[bytes, bytes]] = {}

    def __call__(self, index: int, text: str) -> bytes:
        template = self.templates.get(index)
        if template is None:
            head, mark, tail = self.event(index, self._MARK).partition(self._MARK_JSON)
            assert mark and self._MARK_JSON not in tail, "the text appears once in the event"
            template = self.templates[index] = (head, tail)
        return template[0] + json.dumps(text, ensure_ascii=False).encode() + template[1]


def create_app(engine: Union[Engine, Callable[[], Engine]], *, model_name: Optional[str] = None,
               api_key: Optional[str] = None, max_queued: Optional[int] = None,
               limits: Optional[Limits] = None, stream_interval: int = 1) -> Starlette:
    """The OpenAI-compatible ASGI application over ``engine``.

    ``engine``: a ``fastpar.Engine`` (the caller keeps it and closes it), or a function
    that loads and returns one: it is called on a worker thread when the application
    starts, ``/health`` answers 503 until it returns, and the application closes that
    engine when it shuts down. ``max_queued``: how many engine requests (prompts x
    samples) may wait for a slot before a request that would add to them is answered 429
    (default: the engine's own ``max_queued``, which always applies). ``model_name``: the name ``/v1/models``
    lists and responses carry (default: the GGUF file's name); requests may name any
    model. ``api_key``: when set, ``/v1/*`` and ``POST /prefix-cache/clear`` need
    ``Authorization: Bearer <api_key>`` (else 401); ``/health`` and ``/metrics`` stay open.
    ``limits``: what one request may ask (``fastpar.server.protocol.Limits``: body size,
    ``n``, prompts, ``max_tokens``).
    ``stream_interval``: a streamed choice's text goes out in events of at least this many
    tokens (its first token and its last come at once; a stream with tools or a split
    thought sends what its parser gives); larger values make fewer events and less work a
    token for the server and its clients.
    """
    if api_key is not None and (not isinstance(api_key, str) or not api_key):
        raise ValueError("api_key must be a non-empty str or None")
    if not isinstance(engine, Engine) and not callable(engine):
        raise TypeError(f"engine must be a fastpar.Engine or a function returning one, got {type(engine).__name__}")
    if max_queued is not None and (isinstance(max_queued, bool) or not isinstance(max_queued, int) or max_queued < 0):
        raise ValueError(f"max_queued must be an int >= 0 or None, got {max_queued!r}")
    if isinstance(stream_interval, bool) or not isinstance(stream_interval, int) or stream_interval < 1:
        raise ValueError(f"stream_interval must be an integer >= 1, got {stream_interval!r}")
    if limits is not None and not isinstance(limits, Limits):
        raise TypeError(f"limits must be a fastpar.server.protocol.Limits, got {type(limits).__name__}")
    state = _State(engine, model_name, api_key)
    state.limits = limits or Limits()
    metrics = state.metrics

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        loading = None
        if state.loader is not None:
            def load() -> None:
                try:
                    e = state.loader()
                    if not isinstance(e, Engine):
                        raise TypeError(f"the engine loader returned {type(e).__name__}, not a fastpar.Engine")
                    if state.model_name is None:
                        state.model_name = _name_of(e)
                    state.engine = e
                    logger.info("model %s loaded", state.model_name)
                except BaseException as e:  # noqa: BLE001 - reported by /health and the log
                    state.load_error = e
                    logger.error("loading the model failed: %s", e)

            loading = asyncio.get_running_loop().run_in_executor(None, load)
        try:
            yield
        finally:
            if loading is not None:
                await loading
            if state.owned and state.engine is not None:
                # Cancels what still runs; the worker thread ends within a step.
                await asyncio.get_running_loop().run_in_executor(None, state.engine.close)

    def finished(name: str, t0: float, completions: List[Completion], n_prompt: int, outcome: str) -> None:
        metrics.requests.labels(name, outcome).inc()
        metrics.latency.observe(time.monotonic() - t0)
        metrics.prompt_tokens.inc(n_prompt)
        metrics.generated_tokens.inc(sum(c.n_gen_tokens for c in completions))
        for c in completions:
            if c.n_gen_tokens > 0:
                metrics.ttft.observe(c.t_first_token_ms / 1000.0)

    def generation_endpoint(chat: bool) -> Callable:
        name = "chat" if chat else "completions"

        async def run(request: HTTPRequest) -> Response:
            t0 = time.monotonic()
            try:
                state.check_key(request)
                if state.stopping:
                    raise _shutting_down()
                engine = state.ready()
                if engine.embeddings:
                    what = ("reranks (fastpar serve --rerank): POST /v1/rerank" if engine.pooling == "rank" else
                            "serves embeddings (fastpar serve --embeddings): POST /v1/embeddings")
                    raise APIError(400, f"this server {what}, or start one without that option to generate",
                                   code="embeddings_only")
                body = await _json_body(request)
                req = parse(body, chat, engine.n_ctx_per_seq, state.limits, chat and thinks(engine.model))
                if max_queued is not None:
                    s = engine.stats()
                    free = engine.n_parallel - s.n_active
                    if s.n_queued + len(req.prompts) * req.n - max(free, 0) > max_queued:
                        raise _queue_full()
                # A prompt with tools is rendered by its Jinja template (milliseconds): off the loop.
                args = (engine, req, asyncio.get_running_loop(), asyncio.Event())
                job = await asyncio.to_thread(_Job, *args) if "tools" in req.opts else _Job(*args)
                state.jobs.add(job)
            except APIError as e:
                outcome = {400: "bad_request", 401: "unauthorized", 429: "queue_full"}.get(e.status, "error")
                metrics.requests.labels(name, outcome).inc()
                return _error(e)
            gone = asyncio.ensure_future(_wait_disconnect(request.receive))
            gone.add_done_callback(lambda _: job.news.set())
            try:
                # Nothing is sent before the engine has answered once: a prompt that
                # cannot be served (too long, empty) is a 400, not a stream that fails.
                if not any(job.choice_done(k) for k in range(job.n_choices)) and not await job.wait(gone):
                    job.cancel()
                    gone.cancel()
                    metrics.requests.labels(name, "client_disconnect").inc()
                    return Response(status_code=499)
                for k in range(job.n_choices):
                    if not job.choice_done(k):
                        continue
                    c = job.choice_result(k)
                    bad = prompt_failure(c, req.choice_param(k))
                    if bad is None and c.finish_reason == "cancelled":  # the server stops
                        bad = failure(c, req.choice_param(k))
                    if bad is not None:
                        job.cancel()
                        gone.cancel()
                        metrics.requests.labels(name, "bad_request" if bad.status == 400 else "error").inc()
                        return _error(bad)
            except BaseException:
                job.cancel()
                gone.cancel()
                raise
            rid = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
            model = req.model or state.model_name
            if not req.stream:
                return await whole(name, req, job, gone, rid, model, engine, t0)
            return _EventStream(stream(name, req, job, gone, rid, model, engine, t0), media_type="text/event-stream",
                                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

        return run

    async def whole(name: str, req: Parsed, job: _Job, gone, rid: str, model: str, engine: Engine,
                    t0: float) -> Response:
        try:
            while not job.done():
                if not await job.wait(gone):
                    job.cancel()
                    finished(name, t0, [], 0, "client_disconnect")
                    return Response(status_code=499)
        except BaseException:  # the server cancels it (shutdown)
            job.cancel()
            raise
        finally:
            gone.cancel()
        completions = job.completions()
        n_prompt, _ = prompt_tokens(completions, len(req.prompts), req.n)
        for k, c in enumerate(completions):
            err = failure(c, req.choice_param(k))
            if err is not None:
                finished(name, t0, completions, n_prompt, "error")
                return _error(err)
        finished(name, t0, completions, n_prompt, "success")
        return JSONResponse(response_body(req, rid, int(time.time()), model, completions, engine.model))

    async def stream(name: str, req: Parsed, job: _Job, gone, rid: str, model: str, engine: Engine, t0: float):
        chat = req.chat
        obj = "chat.completion.chunk" if chat else "text_completion"
        created = int(time.time())
        extra = {"usage": None} if req.include_usage else {}
        vocab = engine.model

        def chunk(index: int, text: Optional[str], finish: Optional[str], logprobs: Any = None,
                  role: bool = False, reasoning: str = "", delta: Optional[Dict[str, Any]] = None) -> bytes:
            if chat:
                delta = dict(delta or {}, **({"role": "assistant"} if role else {}))
                if reasoning:
                    delta["reasoning_content"] = reasoning
                if text is not None:
                    delta["content"] = text
                choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            else:
                choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
            return _sse({"id": rid, "object": obj, "created": created, "model": model, "system_fingerprint": None,
                         "choices": [choice], **extra})

        text_event = _TextEvents(lambda index, text: chunk(index, text, None))
        n = job.n
        pending = list(range(job.n_choices))
        # Thoughts split off as they stream, as the core splits the finished text.
        splits: Dict[int, ThoughtSplit] = {}
        if chat and req.opts.get("reasoning") == "split":
            opened = [opens_thought(vocab.apply_chat_template(messages)) for messages in req.prompts]
            splits = {k: ThoughtSplit(opened[k // n]) for k in pending}
        # With tools, content and calls as the parser reads them from the text so far.
        calls = {k: ToolStream(job.requests[k // n]) for k in pending} if chat and "tools" in req.opts else {}
        cache: Dict[int, bytes] = {}
        held: Dict[int, List[str]] = {}  # pieces not yet sent (stream_interval)
        started: Set[int] = set()  # choices whose first piece went out
        completions: List[Optional[Completion]] = [None] * job.n_choices
        outcome = "client_disconnect"
        try:
            for k in range(job.n_choices):
                if chat:
                    yield chunk(k, "", None, role=True)
                elif req.echo:
                    yield chunk(k, req.prompts[k // n], None)
            while pending:
                # Before taking: no piece of a sample can follow its finish.
                ended = {k for k in pending if job.choice_done(k)}
                texts: Dict[int, List[str]] = {}
                for i in sorted({k // n for k in pending}):
                    for j, piece in job.requests[i].take_pieces():
                        texts.setdefault(i * n + j, []).append(piece)
                still = []
                for k in pending:
                    if k in calls:
                        for delta in calls[k].feed("".join(texts.get(k, ()))):
                            yield chunk(k, None, None, delta=delta)
                    elif k in splits:
                        reasoning, content = splits[k].feed("".join(texts.get(k, ())), k in ended)
                        if reasoning or content:
                            yield chunk(k, content or None, None, reasoning=reasoning)
                    elif k in texts or k in held:
                        # At least stream_interval pieces an event, but the first at once
                        # (time to first token) and the last with the finish.
                        buf = held.setdefault(k, [])
                        buf.extend(texts.get(k, ()))
                        if len(buf) >= stream_interval or k in ended or k not in started:
                            started.add(k)
                            yield text_event(k, "".join(buf))
                            del held[k]
                    if k not in ended:
                        still.append(k)
                        continue
                    c = completions[k] = job.choice_result(k)
                    err = failure(c, req.choice_param(k))
                    if err is not None:
                        # After the stream began, an error is an "error" event (OpenAI's
                        # clients raise it); the other samples are cancelled.
                        outcome = "error"
                        job.cancel()
                        yield _sse(err.body())
                        return
                    for delta in calls[k].finish(c) if k in calls else ():
                        yield chunk(k, None, None, delta=delta)
                    yield chunk(k, None if chat else "", c.finish_reason, chunk_logprobs(req, c, vocab, cache))
                pending = still
                if pending and not await job.wait(gone):
                    return
            done_list = [c for c in completions if c is not None]
            counts = usage(completions, len(req.prompts), req.n)
            if req.include_usage:
                yield _sse({"id": rid, "object": obj, "created": created, "model": model,
                            "system_fingerprint": None, "choices": [], "usage": counts})
            yield _DONE
            outcome = "success"
            finished(name, t0, done_list, counts["prompt_tokens"], outcome)
        finally:
            # A client that leaves (seen by the disconnect watcher, or a failed send that
            # closes this generator) cancels what still generates: its slot frees in a step.
            gone.cancel()
            if outcome != "success":
                job.cancel()
                finished(name, t0, [c for c in completions if c is not None], 0, outcome)

    async def models(request: HTTPRequest) -> Response:
        try:
            state.check_key(request)
        except APIError as e:
            return _error(e)
        data = []
        if state.model_name is not None:
            data.append({"id": state.model_name, "object": "model", "created": state.created, "owned_by": "fastpar"})
        return JSONResponse({"object": "list", "data": data})

    async def health(request: HTTPRequest) -> Response:
        if state.engine is None:
            body = {"status": "error" if state.load_error is not None else "loading"}
            if state.load_error is not None:
                body["error"] = str(state.load_error)
            return JSONResponse(body, status_code=503)
        if state.stopping:
            return JSONResponse({"status": "stopping"}, status_code=503)
        if state.engine.closed:
            return JSONResponse({"status": "closed"}, status_code=503)
        s = state.engine.stats()
        return JSONResponse({"status": "ok", "model": state.model_name, "slots_busy": s.n_active,
                             "slots_total": state.engine.n_parallel, "queue_depth": s.n_queued})

    async def clear_prefix_cache(request: HTTPRequest) -> Response:
        # An operator's reset (to free the host memory it holds, or after changing what a
        # prompt means): empties the prefix cache between steps, running requests go on; the
        # API key guards it as /v1/*. Off the event loop: it waits for the step in progress.
        try:
            state.check_key(request)
            if state.stopping:
                raise _shutting_down()
            engine = state.ready()
        except APIError as e:
            return _error(e)
        before = engine.prefix_cache_stats()
        await asyncio.get_running_loop().run_in_executor(None, engine.clear_prefix_cache)
        return JSONResponse({"cleared": True, "host_entries": before.n_host_entries, "host_bytes": before.bytes_host,
                             "slots_held": before.n_slots_held})

    async def metrics_endpoint(request: HTTPRequest) -> Response:
        return Response(prometheus_client.generate_latest(metrics.registry),
                        media_type=prometheus_client.CONTENT_TYPE_LATEST)

    routes = [
        Route("/v1/chat/completions", generation_endpoint(True), methods=["POST"]),
        Route("/v1/completions", generation_endpoint(False), methods=["POST"]),
        Route("/v1/embeddings", vector_endpoint("embeddings", answer_embeddings, state, _error, _shutting_down,
                                                _json_body), methods=["POST"]),
        *(Route(path, vector_endpoint("rerank", answer_rerank, state, _error, _shutting_down, _json_body),
                methods=["POST"]) for path in RERANK_PATHS),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/prefix-cache/clear", clear_prefix_cache, methods=["POST"]),
    ]

    async def http_error(request: HTTPRequest, exc: Exception) -> Response:
        # An unknown path or method: OpenAI's error body, as every other error.
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            message, code = f"no such endpoint: {request.method} {request.url.path}", "not_found"
        elif exc.status_code == 405:
            message, code = f"{request.method} is not allowed on {request.url.path}", "method_not_allowed"
        else:
            message, code = str(exc.detail), None
        return _error(APIError(exc.status_code, message, code=code, headers=exc.headers))

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.fastpar = state
    return app
