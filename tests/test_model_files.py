"""Loading: missing, truncated, garbage and malformed GGUF files raise clear errors, never crash."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest

import fastpar


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        fastpar.Model(tmp_path / "nope.gguf")


def test_directory_is_not_a_model(tmp_path):
    with pytest.raises(ValueError, match="not a regular file"):
        fastpar.Model(tmp_path)


def test_truncated_gguf_raises_model_load_error(model, tmp_path):
    data = pathlib.Path(model.path).read_bytes()
    for size in (0, 3, 64, 4096, len(data) // 2):
        path = tmp_path / f"truncated_{size}.gguf"
        path.write_bytes(data[:size])
        with pytest.raises(fastpar.ModelLoadError, match="failed to load model"):
            fastpar.Model(path)


def test_garbage_file_raises_model_load_error(tmp_path):
    path = tmp_path / "garbage.gguf"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 100_000, dtype=np.uint8).tobytes())
    with pytest.raises(fastpar.ModelLoadError, match="failed to load model") as info:
        fastpar.Model(path)
    assert isinstance(info.value, fastpar.FastparError) and isinstance(info.value, RuntimeError)


def _write_gguf(path, arch: str, with_tensor: bool) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_head_count(1)
    if with_tensor:
        writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("arch, with_tensor", [("llama", True), ("llama", False), ("no-such-arch", False)])
def test_malformed_generated_gguf_raises_model_load_error(tmp_path, arch, with_tensor):
    path = tmp_path / "malformed.gguf"
    _write_gguf(path, arch, with_tensor)
    with pytest.raises(fastpar.ModelLoadError):
        fastpar.Model(path)


def test_load_errors_do_not_kill_the_process(tmp_path):
    # Belt and braces: the same loads in a child process must exit normally (no abort).
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF" + b"\xff" * 60)
    code = ("import fastpar, sys\n"
            "try:\n    fastpar.Model(sys.argv[1])\nexcept fastpar.ModelLoadError:\n    print('clean error')\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "clean error" in proc.stdout
