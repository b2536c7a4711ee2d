"""``serve(...)``: ``fastpar serve``'s process. It loads the model once the port is open,
runs the application (app.py's ``create_app``) with uvicorn until SIGTERM or Ctrl-C, then
stops accepting, lets the requests in flight finish for a while and closes the engine."""

from __future__ import annotations

import math
import os
from typing import Any, Optional

import fastpar
from fastpar import Engine

from .app import _State, create_app
from .protocol import N_CTX_PER_SEQ, SERVE_PREFIX_CACHE_MIB, Limits

__all__ = ["serve"]


#: Seconds the server waits, once the requests in flight have finished or been cancelled,
#: for their last answers to be sent before uvicorn cancels what is left.
_SEND_GRACE_S = 5.0


def serve(model: Optional[str] = None, *, host: str = "127.0.0.1", port: int = 8000, n_parallel: int = 8,
          n_ctx_per_seq: int = N_CTX_PER_SEQ, n_gpu_layers: int = 0, n_threads: Optional[int] = None,
          max_queued: int = 1024, type_k: Optional[str] = None, type_v: Optional[str] = None,
          kv_unified: Optional[bool] = None,
          prefix_cache_mib: Optional[int] = SERVE_PREFIX_CACHE_MIB, prefix_cache_dir: Optional[str] = None,
          embeddings: bool = False, pooling: Optional[str] = None, limits: Optional[Limits] = None,
          api_key: Optional[str] = None, model_name: Optional[str] = None, stream_interval: int = 1,
          shutdown_timeout: float = 5.0, log_level: str = "info") -> int:
    """Run the server until SIGTERM or Ctrl-C, then stop accepting, give the requests in
    flight up to ``shutdown_timeout`` seconds, cancel the rest (answered 503, or a stream's
    error event) and close the engine; returns 0, or 1 if the model failed to load.
    ``model``: a GGUF path (default: the default model, fetched on first use). The model
    loads once the port is open; ``/health`` answers 503 until it has. ``type_k`` and
    ``type_v`` are the KV cache's types and ``kv_unified`` its layout (``fastpar.Context``;
    None: its default),
    ``prefix_cache_mib`` the prefix cache's host memory (default -1: on, unlike the library's
    ``Context``; 0: off) and ``prefix_cache_dir`` its folder across restarts. ``embeddings``
    serves ``/v1/embeddings`` instead of generation, pooling by ``pooling`` (None: the model's
    own, else mean). ``limits``: what one request may ask and ``stream_interval`` the tokens
    a streamed event gathers (``create_app``). A missing model file, a port out of range or
    a negative ``shutdown_timeout`` raise ``ValueError`` (or ``FileNotFoundError``) before
    anything starts."""
    import signal

    import uvicorn

    if model is not None and not os.path.isfile(model):
        raise FileNotFoundError(f"no such model file: {model}")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port must be between 1 and 65535, got {port!r}")
    if isinstance(shutdown_timeout, bool) or not isinstance(shutdown_timeout, (int, float)) \
            or not math.isfinite(shutdown_timeout) or shutdown_timeout < 0:
        raise ValueError(f"shutdown_timeout must be a number of seconds >= 0, got {shutdown_timeout!r}")

    class Server(uvicorn.Server):
        # uvicorn re-raises the signal it stopped on once it has shut down, so the process
        # would die of SIGTERM; a graceful stop is a clean exit here.
        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True

        async def shutdown(self, sockets: Optional[list] = None) -> None:
            # The app ends its own requests first (state.stop): uvicorn's graceful timeout
            # would cancel their tasks mid-answer, a 500 or a stream cut without its event.
            for s in self.servers:
                s.close()  # no new connections while the requests in flight finish
            await state.stop(shutdown_timeout, lambda: self.force_exit)
            await super().shutdown(sockets)

    server: Optional[Server] = None

    def load() -> Engine:
        try:
            path = model if model is not None else fastpar.default_model_path()
            m = fastpar.Model(path, n_gpu_layers=n_gpu_layers)
            kv_types = {k: v for k, v in (("type_k", type_k), ("type_v", type_v), ("kv_unified", kv_unified),
                                          ("prefix_cache_mib", prefix_cache_mib),
                                          ("prefix_cache_dir", prefix_cache_dir)) if v is not None}
            return Engine(m, n_parallel=n_parallel, n_ctx_per_seq=n_ctx_per_seq, n_threads=n_threads,
                          max_queued=max_queued, embeddings=embeddings, pooling=pooling, **kv_types)
        except BaseException:
            if server is not None:
                server.should_exit = True
            raise

    app = create_app(load, model_name=model_name, api_key=api_key, limits=limits, stream_interval=stream_interval)
    state: _State = app.state.fastpar
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=_SEND_GRACE_S, access_log=False)
    server = Server(config)
    server.run()
    return 1 if state.load_error is not None or not server.started else 0
