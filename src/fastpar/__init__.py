"""fastpar: many prompts through one llama.cpp model at once.

    import fastpar
    model = fastpar.Model(fastpar.default_model_path())
    ctx = fastpar.Context(model, n_parallel=8)
    for c in fastpar.generate_parallel(ctx, ["The capital of France is", "2 + 2 ="], max_tokens=16):
        print(c.finish_reason, c.text)
"""

from . import _openmp

_openmp.choose()  # before the native modules load OpenMP (_openmp.py says why)

from ._context import Context, generate_parallel  # noqa: E402
from ._embed import Embeddings, Scores, embed, rerank
from ._model import Model
from ._options import SamplingParams
from ._core import (MAX_TOP_LOGPROBS, ChatReply, Completion, EngineClosed, EngineStats, FastparError, ModelLoadError,
                    QueueFull, Stats, ToolCall)
from ._engine import Engine, Request
from ._tools import new_tool_call_id
from ._core import backend as _backend
from ._models import default_model_path
from ._scoring import Loglikelihood, Perplexity, RollingLoglikelihood, loglikelihood, loglikelihood_rolling, perplexity
from ._version import __version__

__all__ = [
    "ChatReply",
    "Completion",
    "Context",
    "Embeddings",
    "Engine",
    "EngineClosed",
    "EngineStats",
    "FastparError",
    "Loglikelihood",
    "MAX_TOP_LOGPROBS",
    "Model",
    "ModelLoadError",
    "Perplexity",
    "QueueFull",
    "Request",
    "RollingLoglikelihood",
    "SamplingParams",
    "Scores",
    "Stats",
    "ToolCall",
    "__version__",
    "backend",
    "default_model_path",
    "embed",
    "generate_parallel",
    "loglikelihood",
    "loglikelihood_rolling",
    "new_tool_call_id",
    "perplexity",
    "rerank",
    "get_include",
    "get_library",
]


def backend() -> str:
    """The backend the native library was built for: ``"cpu"``, ``"cuda"`` or ``"metal"``."""
    return _backend()


def _native_dir():
    """The folder of the native modules, libfastpar and include/: the package's own folder,
    or, in an editable install, the one the build installed them into."""
    import pathlib

    from . import _core

    return pathlib.Path(_core.__file__).parent


def get_include() -> str:
    """Folder holding ``fastpar.h``, for C and FFI consumers."""
    return str(_native_dir() / "include")


def get_library() -> str:
    """Path of the shared library ``libfastpar`` that implements ``fastpar.h``."""
    here = _native_dir()
    for name in ("libfastpar.so", "libfastpar.dylib", "fastpar.dll"):
        if (here / name).is_file():
            return str(here / name)
    raise FileNotFoundError(f"libfastpar is not installed next to {here}")
