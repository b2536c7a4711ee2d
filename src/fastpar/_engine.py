"""The background engine: submit from any thread, stream, cancel, await.

The engine is the same scheduler loop as ``generate_parallel``, run on one worker
thread that owns one context (docs/design.md): requests join free slots as others finish.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Iterator, List, Optional

from . import _core
from ._api import _CONTEXT_DEFAULTS, Model, Prompt, SamplingParams, _context_params, _params_list, _prompt, _with_options

__all__ = ["Engine", "Request"]

#: Requests that may wait for a slot, once every slot is taken, before ``submit`` raises
#: ``fastpar.QueueFull``.
DEFAULT_MAX_QUEUED = 1024


class Request:
    """One submitted prompt. Iterate over it for its text as it is generated (each piece
    valid UTF-8; the pieces add up to the final text), or call ``result()``."""

    def __init__(self, handle: _core.RequestHandle) -> None:
        self._handle = handle

    @property
    def id(self) -> int:
        return self._handle.id

    def cancel(self) -> None:
        """End this request with ``finish_reason == "cancelled"`` (no effect once done)."""
        self._handle.cancel()

    def done(self) -> bool:
        return self._handle.done()

    def result(self, timeout: Optional[float] = None) -> _core.Completion:
        """The completion, waiting up to ``timeout`` seconds (None: for ever); raises
        ``TimeoutError``. Its ``t_queued_ms``, ``t_first_token_ms`` and ``t_total_ms``
        are this request's timings from submission."""
        return self._handle.result(timeout)

    def __iter__(self) -> Iterator[str]:
        while True:
            piece = self._handle.next_piece(None)
            if piece is None:
                return
            yield piece

    def __repr__(self) -> str:
        return f"fastpar.Request(id={self.id}, done={self.done()})"


class Engine:
    """A thread-safe generation service over one model: ``submit`` from any thread.

    Takes the same context options as ``fastpar.Context``, plus ``max_queued`` (>= 1):
    how many requests may wait once every slot is taken; one more makes ``submit`` raise
    ``fastpar.QueueFull`` (or wait, with ``block=True``). Requests that find a free slot
    never count against it, so a burst of ``n_parallel + max_queued`` is accepted.
    Use it as a context manager, or call ``close()``: requests still queued or running
    then end with ``finish_reason == "cancelled"``.

    If the worker thread fails (an error inside llama.cpp, not a bad prompt, which fails
    alone), every queued and running request ends with ``finish_reason == "error"`` and
    the failure's message, and ``submit`` raises ``fastpar.EngineClosed`` naming it.
    """

    def __init__(self, model: Model, *, n_parallel: int = _CONTEXT_DEFAULTS.n_parallel,
                 n_ctx_per_seq: int = _CONTEXT_DEFAULTS.n_ctx_per_seq, n_batch: Optional[int] = None,
                 n_threads: Optional[int] = None, kv_unified: bool = _CONTEXT_DEFAULTS.kv_unified,
                 device_sampling: Optional[bool] = None,
                 share_prefixes: bool = _CONTEXT_DEFAULTS.share_prefixes,
                 warmup: Optional[bool] = None,
                 max_queued: int = DEFAULT_MAX_QUEUED) -> None:
        if not isinstance(model, Model):
            raise TypeError(f"model must be a fastpar.Model, got {type(model).__name__}")
        params = _context_params(n_parallel, n_ctx_per_seq, n_batch, n_threads, kv_unified, device_sampling,
                                 share_prefixes, warmup)
        if isinstance(max_queued, bool) or not isinstance(max_queued, int):
            raise TypeError(f"max_queued must be an int, got {type(max_queued).__name__}")
        if max_queued < 1:
            raise ValueError(f"max_queued must be >= 1 (requests that may wait for a slot), got {max_queued}")
        self.model = model
        self._engine = _core.Engine(model._model, params, max_queued)

    # -- submitting ---------------------------------------------------------------------

    @_with_options
    def submit(self, prompt: Prompt, params: Optional[SamplingParams] = None, *, block: bool = False,
               timeout: Optional[float] = None, **options) -> Request:
        """Queue one prompt (a ``str`` or chat messages) with one ``fastpar.SamplingParams``
        or ``generate_parallel``'s keyword options (not both: ``TypeError``); returns at
        once. A request is one sample: ``n`` other than 1 is a ``ValueError`` (submit n
        requests with seeds ``seed + j`` instead). When every slot is taken and ``max_queued``
        requests wait, raises ``fastpar.QueueFull``; with ``block=True`` it first waits up
        to ``timeout`` seconds (None: for ever) for room (``timeout`` counts only with
        ``block=True``, as in ``queue.Queue.put``). Raises ``fastpar.EngineClosed`` after
        ``close()`` or after the worker failed."""
        if not isinstance(block, bool):
            raise TypeError(f"block must be a bool, got {type(block).__name__}")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise TypeError(f"timeout must be a number of seconds or None, got {type(timeout).__name__}")
            if not timeout >= 0:
                raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout}")
        wait = (None if timeout is None else float(timeout)) if block else 0.0
        return Request(self._engine.submit(_prompt(prompt, "prompt"), _request_params("Engine.submit", params, options),
                                           wait))

    @_with_options
    def generate(self, prompt: Prompt, params: Optional[SamplingParams] = None, **options) -> _core.Completion:
        """``submit(prompt, params, **options).result()``."""
        return self._submit(prompt, "Engine.generate", params, options).result()

    def _submit(self, prompt: Prompt, call: str, params: Optional[SamplingParams], options: dict) -> Request:
        return Request(self._engine.submit(_prompt(prompt, "prompt"), _request_params(call, params, options), 0.0))

    @_with_options
    async def agenerate(self, prompt: Prompt, params: Optional[SamplingParams] = None,
                        **options) -> _core.Completion:
        """Await one completion without blocking the event loop. Cancelling the awaiting
        task cancels the request."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        request = self._submit(prompt, "Engine.agenerate", params, options)

        def on_update() -> None:  # on the engine's thread
            if request.done():
                loop.call_soon_threadsafe(_resolve, future, request)

        request._handle.set_listener(on_update)
        try:
            return await future
        finally:
            if not request.done():
                request.cancel()

    @_with_options
    async def astream(self, prompt: Prompt, params: Optional[SamplingParams] = None,
                      **options) -> AsyncIterator[str]:
        """Yield text pieces as they are generated, without blocking the event loop.
        Leaving the loop early cancels the request."""
        loop = asyncio.get_running_loop()
        wakeup = asyncio.Event()
        request = self._submit(prompt, "Engine.astream", params, options)
        request._handle.set_listener(lambda: loop.call_soon_threadsafe(wakeup.set))
        try:
            while True:
                await wakeup.wait()
                wakeup.clear()
                finished = request.done()  # before taking: no piece can follow a finish
                for piece in request._handle.take_pieces():
                    yield piece
                if finished:
                    return
        finally:
            if not request.done():
                request.cancel()

    # -- state ----------------------------------------------------------------------------

    def stats(self) -> _core.EngineStats:
        """Active and queued requests, totals, and generated tokens per busy second."""
        return self._engine.stats()

    def kv_seq_pos_max(self) -> List[int]:
        """Highest KV position each slot holds (read between steps); -1 = empty."""
        return self._engine.seq_pos_max()

    @property
    def closed(self) -> bool:
        return self._engine.closed

    def close(self) -> None:
        """Cancel what is queued or running, stop the worker thread. Idempotent."""
        self._engine.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.close()


def _request_params(call: str, params: Optional[SamplingParams], options: dict) -> _core.GenerateParams:
    if params is not None and not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a fastpar.SamplingParams, got {type(params).__name__}")
    (sp,) = _params_list(call, params, options, 1)
    if sp.n != 1:
        raise ValueError(f"{call}(): n={sp.n}, but a request is one sample (one stream, one result); "
                         "submit n requests with seeds seed + j, or use generate_parallel")
    return sp._params


def _resolve(future: asyncio.Future, request: Request) -> None:
    if not future.done():
        future.set_result(request.result(0))
