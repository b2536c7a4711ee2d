"""The background engine: submit from any thread, stream, cancel, await.

The engine is the same scheduler loop as ``generate_parallel``, run on one worker
thread that owns one context (docs/design.md): requests join free slots as others finish.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import os
from typing import Any, AsyncIterator, Callable, Dict, Iterator, List, Optional, Tuple, Union

from . import _core
from ._model import Model
from ._options import (_CONTEXT_DEFAULTS, SamplingParams, _bool, _context_params, _keywords_checked, _params_list,
                       _with_options)
from ._prompts import Prompt, _prompt
from ._tools import render_with_tools

__all__ = ["Engine", "Request"]

#: Requests that may wait for a slot, once every slot is taken, before ``submit`` raises
#: ``fastpar.QueueFull``.
DEFAULT_MAX_QUEUED = 1024


#: Longest a wait on the engine lasts before Python runs its signal handlers: a Ctrl-C in
#: ``Request.result()``, an iteration or a blocked ``submit`` is raised within this time (a
#: wait inside the native call would hold it off until generation ends).
_WAIT_SLICE_S = 0.1


def _interruptible(wait: Callable[[float], object], timeout: Optional[float], on_interrupt: Callable[[], None]):
    """``wait(seconds)`` (which raises ``TimeoutError`` or ``fastpar.QueueFull`` when that
    passes) in slices, up to ``timeout`` seconds (None: for ever). An exception raised
    between slices, a signal handler's (``KeyboardInterrupt``), calls ``on_interrupt`` and
    propagates."""
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    try:
        while True:
            left = _WAIT_SLICE_S if deadline is None else min(_WAIT_SLICE_S, max(0.0, deadline - time.monotonic()))
            try:
                return wait(left)
            except (TimeoutError, _core.QueueFull):
                if deadline is not None and time.monotonic() >= deadline:
                    raise
    except (TimeoutError, _core.QueueFull):
        raise
    except BaseException:
        on_interrupt()
        raise


#: What a request streams: text pieces (``str``) with one sample, ``(sample, piece)`` pairs
#: with several.
Piece = Union[str, Tuple[int, str]]


class Request:
    """One submitted prompt and its ``n`` samples (``SamplingParams.n``; sample ``j`` seeded
    ``seed + j``, as ``generate_parallel`` seeds them, so they give the same completions).
    The samples decode their prompt once and are queued, cancelled and waited for
    together; each streams and finishes on its own.

    ``result()`` gives what ``generate_parallel`` gives for the prompt: one ``Completion``
    with ``n == 1``, the list of ``n`` in sample order otherwise (``completions()`` is
    always that list). Iterating yields the text as it is generated: ``str`` pieces with
    ``n == 1``, ``(sample, piece)`` pairs otherwise, each sample's pieces in order and
    adding up to its final text; it ends once every sample has finished. Leaving the
    iteration early (``break``, an exception, a Ctrl-C, or dropping the iterator) cancels
    the request; so does a Ctrl-C while ``result()`` waits."""

    def __init__(self, handle: _core.RequestHandle, tool_parser: str = "") -> None:
        self._handle = handle
        self._tool_parser = tool_parser
        self._watched: Optional[Tuple["_LoopWaker", int]] = None  # on_update with a loop: its waker, token

    @property
    def id(self) -> int:
        return self._handle.id

    def reply_so_far(self, text: str) -> _core.ChatReply:
        """With tools: the content, thought and complete tool calls of ``text``, a prefix of
        a sample's output (the pieces streamed so far), as its finished ``Completion`` will
        hold them; calls get their ids there. A request without tools raises ``ValueError``
        (its streamed text is its content)."""
        if not self._tool_parser:
            raise ValueError("this request has no tools; its streamed text is its content")
        return _core.parse_reply(self._tool_parser, text, True)

    @property
    def has_tools(self) -> bool:
        """Whether the request was given tools (its output is read for tool calls)."""
        return bool(self._tool_parser)

    @property
    def n(self) -> int:
        """Samples of the prompt."""
        return self._handle.n_samples

    def cancel(self) -> None:
        """End every unfinished sample with ``finish_reason == "cancelled"`` (no effect
        once done)."""
        self._handle.cancel()

    def done(self) -> bool:
        """Whether every sample has finished."""
        return self._handle.done()

    @_keywords_checked
    def sample_done(self, sample: int) -> bool:
        """Whether sample ``sample`` (0 to ``n - 1``) has finished."""
        return self._handle.sample_done(sample)

    @_keywords_checked
    def result(self, timeout: Optional[float] = None) -> Union[_core.Completion, List[_core.Completion]]:
        """The completion (``n == 1``) or the ``n`` completions in sample order, waiting up
        to ``timeout`` seconds (None: for ever) for all of them; raises ``TimeoutError``.
        Their ``t_queued_ms``, ``t_first_token_ms`` and ``t_total_ms`` are each sample's
        timings from submission."""
        completions = self.completions(timeout)
        return completions[0] if len(completions) == 1 else completions

    async def aresult(self) -> Union[_core.Completion, List[_core.Completion]]:
        """What ``result()`` gives, awaited without blocking the event loop: the engine's
        thread wakes the loop when every sample is done (through ``on_update(..., loop=)``,
        which this sets). Leaving early (the awaiting task cancelled) cancels the request."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def on_update() -> None:  # on the loop
            if not future.done() and self.done():
                future.set_result(self.result(0))

        self.on_update(on_update, loop=loop)
        try:
            return await future
        finally:
            if not self.done():
                self.cancel()

    @_keywords_checked
    def completions(self, timeout: Optional[float] = None) -> List[_core.Completion]:
        """The ``n`` completions in sample order (a list also when ``n == 1``), as ``result``."""
        return _interruptible(self._handle.result, timeout, self.cancel)

    @_keywords_checked
    def sample_result(self, sample: int, timeout: Optional[float] = None) -> _core.Completion:
        """Sample ``sample``'s completion, waiting up to ``timeout`` seconds for it alone."""
        return _interruptible(lambda s: self._handle.sample_result(sample, s), timeout, self.cancel)

    def take_pieces(self) -> List[Tuple[int, str]]:
        """Every ``(sample, piece)`` generated since the last take, without waiting (for
        code that waits in an event loop: see ``on_update``). A sample's last piece is
        taken no later than the first ``take_pieces`` after ``sample_done`` turned true.
        Each piece is delivered once, here or to an iterator."""
        return self._handle.take_pieces()

    @_keywords_checked
    def on_update(self, callback: Callable[[], None], *, loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
        """Have ``callback()`` called after new pieces and as each sample finishes (at once
        if the request has finished). One callback per request: a later call replaces it.

        Without ``loop`` it runs on the engine's worker thread, after each piece, holding the
        thread up and taking Python's GIL there: keep it short. Its exceptions are ignored.
        With ``loop`` (an asyncio event loop) it runs on that loop: the engine's thread only
        writes to a pipe the loop watches, so a busy loop never holds generation up. Pieces
        that arrive between two turns of the loop cost one call, and the callback is dropped
        after the call that follows the request's finish. Its exceptions go to the loop's
        exception handler."""
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        self._unwatch()
        if loop is None:
            self._handle.set_listener(callback)
            return
        if not isinstance(loop, asyncio.AbstractEventLoop):
            raise TypeError(f"loop must be an asyncio event loop or None, got {type(loop).__name__}")
        self._handle.set_listener(None)
        try:
            here = asyncio.get_running_loop() is loop
        except RuntimeError:
            here = False
        if here:
            self._watch(loop, callback)
        else:  # a loop's waker is its own thread's to change
            loop.call_soon_threadsafe(self._watch, loop, callback)

    def _watch(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        try:
            waker = _waker(loop)
        except NotImplementedError:  # a loop that cannot watch a pipe (Windows' proactor)
            self._handle.set_listener(lambda: loop.call_soon_threadsafe(callback))
            return
        self._watched = (waker, waker.watch(self._handle, callback))

    def _unwatch(self) -> None:
        if self._watched is not None:
            waker, token = self._watched
            waker.watched.pop(token, None)
            self._watched = None
            self._handle.set_wake(None, 0)

    def __iter__(self) -> Iterator[Piece]:
        single = self.n == 1
        try:
            while True:
                piece = _interruptible(self._handle.next_piece, None, self.cancel)
                if piece is None:
                    return
                yield piece[1] if single else piece
        finally:  # left early: nobody reads the rest
            if not self.done():
                self.cancel()

    def __repr__(self) -> str:
        return f"fastpar.Request(id={self.id}, n={self.n}, done={self.done()})"


class _LoopWaker:
    """Wakes one event loop for the requests watched on it. The engine's thread posts a
    request's token to a pipe (the core's WakePipe) and runs no Python, so it never waits for
    the GIL while the loop is busy; the loop reads the pipe and calls the callbacks of the
    requests with news. A callback is dropped once its request was done before the call."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pipe = _core.WakePipe()
        self.watched: Dict[int, Tuple[_core.RequestHandle, Callable[[], None]]] = {}
        self.tokens = itertools.count(1)
        loop.add_reader(self.pipe.fileno(), self._wake)

    def watch(self, handle: _core.RequestHandle, callback: Callable[[], None]) -> int:
        token = next(self.tokens)
        self.watched[token] = (handle, callback)
        handle.set_wake(self.pipe, token)
        return token

    def _wake(self) -> None:
        for token in self.pipe.drain():
            entry = self.watched.get(token)
            if entry is None:
                continue
            handle, callback = entry
            if handle.done():  # before the call: it sees the finish, and no news can follow
                del self.watched[token]
            try:
                callback()
            except Exception as e:  # one failing callback must not cost the others their wake-up
                self.loop.call_exception_handler({"message": "fastpar: a request's on_update callback failed",
                                                  "exception": e})


_wakers: Dict[int, _LoopWaker] = {}  # id(loop) -> its waker


def _waker(loop: asyncio.AbstractEventLoop) -> "_LoopWaker":
    waker = _wakers.get(id(loop))
    if waker is None or waker.loop is not loop:
        for key in [k for k, w in _wakers.items() if w.loop.is_closed()]:
            del _wakers[key]
        waker = _wakers[id(loop)] = _LoopWaker(loop)
    return waker


def _block_args(block: object, timeout: object) -> Optional[float]:
    """Checks submit's ``block`` and ``timeout``; returns the seconds to wait (None: for ever)."""
    if not isinstance(block, bool):
        raise TypeError(f"block must be a bool, got {type(block).__name__}")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds or None, got {type(timeout).__name__}")
        if not timeout >= 0:
            raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout}")
    return None if timeout is None else float(timeout)


class Engine:
    """A thread-safe generation service over one model: ``submit`` from any thread.

    Takes the same context options as ``fastpar.Context``, plus ``max_queued`` (>= 1):
    how many requests may wait once every slot is taken; one more makes ``submit`` raise
    ``fastpar.QueueFull`` (or wait, with ``block=True``). Requests that find a free slot
    never count against it, so a burst of ``n_parallel + max_queued`` is accepted. Slots
    and the queue count samples: a request of ``n`` samples takes ``n`` places.
    Use it as a context manager, or call ``close()``: requests still queued or running
    then end with ``finish_reason == "cancelled"``.

    If the worker thread fails (an error inside llama.cpp, not a bad prompt, which fails
    alone), every queued and running request ends with ``finish_reason == "error"`` and
    the failure's message, and ``submit`` raises ``fastpar.EngineClosed`` naming it.
    """

    @_keywords_checked
    def __init__(self, model: Model, *, n_parallel: int = _CONTEXT_DEFAULTS.n_parallel,
                 n_ctx_per_seq: int = _CONTEXT_DEFAULTS.n_ctx_per_seq, n_batch: Optional[int] = None,
                 n_threads: Optional[int] = None, kv_unified: bool = _CONTEXT_DEFAULTS.kv_unified,
                 device_sampling: Optional[bool] = None,
                 share_prefixes: bool = _CONTEXT_DEFAULTS.share_prefixes,
                 warmup: Optional[bool] = None, type_k: str = _CONTEXT_DEFAULTS.type_k,
                 type_v: str = _CONTEXT_DEFAULTS.type_v, prefix_cache_mib: int = _CONTEXT_DEFAULTS.prefix_cache_mib,
                 prefix_cache_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
                 embeddings: bool = _CONTEXT_DEFAULTS.embeddings, pooling: Optional[str] = None,
                 max_queued: int = DEFAULT_MAX_QUEUED) -> None:
        if not isinstance(model, Model):
            raise TypeError(f"model must be a fastpar.Model, got {type(model).__name__}")
        params = _context_params(n_parallel, n_ctx_per_seq, n_batch, n_threads, kv_unified, device_sampling,
                                 share_prefixes, warmup, type_k, type_v, prefix_cache_mib, prefix_cache_dir,
                                 embeddings, pooling)
        self.model = model
        self._engine = _core.Engine(model._model, params, _max_queued(max_queued))

    # -- submitting ---------------------------------------------------------------------

    @_keywords_checked
    @_with_options
    def submit(self, prompt: Prompt, params: Optional[SamplingParams] = None, *, block: bool = False,
               timeout: Optional[float] = None, **options) -> Request:
        """Queue one prompt (a ``str``, chat messages or token ids) with one
        ``fastpar.SamplingParams`` or ``generate_parallel``'s keyword options (not both:
        ``TypeError``); returns at once. With ``n > 1`` the request holds ``n`` samples of
        the prompt (``Request``): they count as ``n`` requests against ``n_parallel`` and
        ``max_queued`` and are queued all at once or not at all (``n`` above ``n_parallel +
        max_queued`` is a ``ValueError``). When the samples find no room (every slot taken
        and ``max_queued`` requests waiting), raises ``fastpar.QueueFull``; with
        ``block=True`` it first waits up to ``timeout`` seconds (None: for ever) for room
        (``timeout`` counts only with ``block=True``, as in ``queue.Queue.put``). Raises
        ``fastpar.EngineClosed`` after ``close()`` or after the worker failed."""
        wait = _block_args(block, timeout)
        prompt, core_params = _request(self.model, prompt, "Engine.submit", params, options)
        if not block:
            return Request(self._engine.submit(prompt, core_params, 0.0), core_params.tool_parser)
        return Request(_interruptible(lambda s: self._engine.submit(prompt, core_params, s), wait, lambda: None),
                       core_params.tool_parser)

    @_keywords_checked
    def submit_embedding(self, text: Prompt, *, normalize: bool = True, block: bool = False,
                         timeout: Optional[float] = None) -> Request:
        """Queue one text (an engine made with ``embeddings=True``); returns at once. Texts
        submitted from any thread share the engine's steps. ``request.result().embedding``
        is its vector (a list of floats; ``finish_reason == "error"`` and ``error`` when the
        text cannot be embedded, as ``fastpar.embed`` says). ``block`` and ``timeout`` as for
        ``submit``; ``normalize`` as for ``fastpar.embed``."""
        wait = _block_args(block, timeout)
        normalize = _bool("normalize", normalize)
        text = _prompt(text, "text")
        if not block:
            return Request(self._engine.submit_embedding(text, normalize, 0.0))
        return Request(_interruptible(lambda s: self._engine.submit_embedding(text, normalize, s), wait,
                                      lambda: None))

    @_keywords_checked
    async def aembed(self, text: Prompt, *, normalize: bool = True) -> List[float]:
        """Await one text's vector without blocking the event loop (an embeddings engine).
        Raises ``ValueError`` with the reason when the text cannot be embedded."""
        done = await self.submit_embedding(text, normalize=normalize).aresult()
        if done.finish_reason == "error":
            raise ValueError(done.error)
        return done.embedding

    @property
    def embeddings(self) -> bool:
        """Whether this engine was made for embeddings (``embeddings=True``)."""
        return self._engine.embeddings

    @property
    def pooling(self) -> Optional[str]:
        """An embeddings engine's pooling as used (``None`` for generation)."""
        return self._engine.pooling or None

    @property
    def embedding_size(self) -> int:
        """The length of the model's embedding vectors."""
        return self._engine.embedding_size

    @_keywords_checked
    @_with_options
    def generate(self, prompt: Prompt, params: Optional[SamplingParams] = None,
                 **options) -> Union[_core.Completion, List[_core.Completion]]:
        """``submit(prompt, params, **options).result()``: a ``Completion``, or the list of
        ``n`` with ``n > 1``."""
        return self._submit(prompt, "Engine.generate", params, options).result()

    def _submit(self, prompt: Prompt, call: str, params: Optional[SamplingParams], options: dict) -> Request:
        prompt, core_params = _request(self.model, prompt, call, params, options)
        return Request(self._engine.submit(prompt, core_params, 0.0), core_params.tool_parser)

    @_keywords_checked
    @_with_options
    async def agenerate(self, prompt: Prompt, params: Optional[SamplingParams] = None,
                        **options) -> Union[_core.Completion, List[_core.Completion]]:
        """Await what ``generate`` returns without blocking the event loop. Cancelling the
        awaiting task cancels the request."""
        return await self._submit(prompt, "Engine.agenerate", params, options).aresult()

    @_keywords_checked
    @_with_options
    async def astream(self, prompt: Prompt, params: Optional[SamplingParams] = None,
                      **options) -> AsyncIterator[Piece]:
        """Yield what iterating a ``Request`` yields (``str`` pieces; ``(sample, piece)``
        pairs with ``n > 1``) as it is generated, without blocking the event loop. Leaving
        the loop early cancels the request."""
        wakeup = asyncio.Event()
        request = self._submit(prompt, "Engine.astream", params, options)
        single = request.n == 1
        request.on_update(wakeup.set, loop=asyncio.get_running_loop())
        try:
            while True:
                await wakeup.wait()
                wakeup.clear()
                finished = request.done()  # before taking: no piece can follow a finish
                for piece in request.take_pieces():
                    yield piece[1] if single else piece
                if finished:
                    return
        finally:
            if not request.done():
                request.cancel()

    # -- state ----------------------------------------------------------------------------

    @property
    def n_parallel(self) -> int:
        """Slots: samples decoded together."""
        return self._engine.n_parallel

    @property
    def n_ctx_per_seq(self) -> int:
        """Positions one prompt plus its generation may use (as ``Context.n_ctx_per_seq``)."""
        return self._engine.n_ctx_per_seq

    # -- state ----------------------------------------------------------------------------

    def stats(self) -> _core.EngineStats:
        """Active and queued requests, totals, and generated tokens per busy second; counted
        in samples (a request of ``n`` samples counts ``n``, each with its own outcome)."""
        return self._engine.stats()

    def prefix_cache_stats(self) -> _core.PrefixCacheStats:
        """The prefix cache's counts, as ``Context.prefix_cache_stats()``."""
        return self._engine.prefix_cache_stats()

    def clear_prefix_cache(self) -> None:
        """Empty the prefix cache (between steps; running requests go on)."""
        self._engine.clear_prefix_cache()

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


def _max_queued(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_queued must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"max_queued must be >= 1 (requests that may wait for a slot), got {value}")
    return value


def _request(model: Model, prompt: Prompt, call: str, params: Optional[SamplingParams], options: dict):
    """The prompt and core options of one request; with tools, the prompt rendered with them."""
    if params is not None and not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a fastpar.SamplingParams, got {type(params).__name__}")
    (sp,) = _params_list(call, params, options, 1)
    if sp.tools is not None:
        text, core = render_with_tools(model._model, prompt, sp, "prompt")
        return _prompt(text, "prompt"), core
    return _prompt(prompt, "prompt"), sp._params
