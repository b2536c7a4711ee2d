"""fastpar's OpenAI-compatible server, a client of fastpar's public API like any user's code.

``create_app(engine)`` returns the ASGI application (app.py) and ``serve(...)`` runs it
(``fastpar serve``, service.py); both need ``pip install 'fastpar[server]'``. protocol.py
translates OpenAI's request and response schemas and has no web dependency: ``fastpar run``
(batch.py) answers files of requests with it through ``generate_parallel``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["create_app", "serve"]

if TYPE_CHECKING:
    from .app import create_app
    from .service import serve


def __getattr__(name: str) -> Any:
    # The application is imported on first use, so that ``fastpar run`` (batch.py) needs
    # none of the server's dependencies; without them this raises ImportError naming them.
    if name == "create_app":
        from .app import create_app

        return create_app
    if name == "serve":
        from .service import serve

        return serve
    raise AttributeError(f"module 'fastpar.server' has no attribute {name!r}")
