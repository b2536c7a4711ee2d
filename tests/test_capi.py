"""The C ABI from a C program compiled against the installed header and library."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

import fastpar
from conftest import N_GPU_LAYERS, ON_GPU

HERE = pathlib.Path(__file__).parent


def compile_c(name: str, out_dir: pathlib.Path) -> pathlib.Path:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to test the C ABI"
    lib = pathlib.Path(fastpar.get_library())
    out = out_dir / name
    cmd = [cc, "-std=c11", "-Wall", "-Wextra", "-Werror", str(HERE / "c" / f"{name}.c"),
           f"-I{fastpar.get_include()}", f"-L{lib.parent}", "-lfastpar", f"-Wl,-rpath,{lib.parent}", "-lm",
           "-o", str(out)]
    subprocess.run(cmd, check=True)
    return out


def run_c(name: str, tmp_path_factory, model, last_line: str) -> list:
    """Compiles tests/c/<name>.c, runs it on the model and returns its output lines, checking
    that it exited 0 and ended with `last_line`."""
    binary = compile_c(name, tmp_path_factory.mktemp("capi"))
    run = subprocess.run([str(binary), model.path], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[-1] == last_line
    return lines


@pytest.fixture(scope="module")
def capi_binary(tmp_path_factory):
    return compile_c("capi_check", tmp_path_factory.mktemp("capi"))


@pytest.fixture(scope="module")
def capi_run(capi_binary, model):
    return subprocess.run([str(capi_binary), model.path], capture_output=True, text=True, timeout=300)


def test_c_program_generates_with_per_prompt_status(capi_run):
    assert capi_run.returncode == 0, capi_run.stdout + capi_run.stderr
    lines = capi_run.stdout.splitlines()
    assert lines[-1] == "capi: ok"
    assert lines[0] == f"capi: version {fastpar.__version__} backend {fastpar.backend()}"
    assert sum("finish 2" in line for line in lines) == 1  # exactly the long prompt failed


def test_c_and_python_agree(capi_run, model):
    # The very call the C program makes (same prompts, slots and options), so the batches
    # have the same shapes: identical results on any backend.
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=128)
    prompts = ["The capital of France is", "word " * 300, "Water boils at", "The quick brown fox"]
    results = fastpar.generate_parallel(ctx, prompts, max_tokens=16, temperature=0.0)
    for i, c in enumerate(results):
        line = next(ln for ln in capi_run.stdout.splitlines() if ln.startswith(f"capi: prompt {i} "))
        c_tokens = [int(t) for t in line.split(" tokens")[1].split("|")[0].split()]
        assert c_tokens == c.token_ids, i


def test_c_generate_per_prompt_params_samples_and_chat(tmp_path_factory, model):
    lines = run_c("capi_generate", tmp_path_factory, model, "capi-gen: ok")
    # The same call from Python: per-prompt params, a chat prompt, 3 samples of the last.
    SP = fastpar.SamplingParams
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=256)
    got = fastpar.generate_parallel(
        ctx, ["The capital of France is", [{"role": "user", "content": "What is the capital of France?"}],
              "Write one sentence about the weather:"],
        [SP(max_tokens=8, temperature=0.0, logprobs=True, top_logprobs=3), SP(max_tokens=8, temperature=0.0),
         SP(max_tokens=8, temperature=1.0, seed=7, n=3)])
    flat = [c for samples in got for c in samples]
    assert len(flat) == 5
    for k, c in enumerate(flat):
        line = next(ln for ln in lines if ln.startswith(f"capi-gen: result {k} "))
        assert [int(t) for t in line.split(" tokens")[1].split("|")[0].split()] == c.token_ids, k
    n_shared = [int(x) for x in next(ln for ln in lines if ln.startswith("capi-gen: shared")).split()[2:]]
    # Five requests on four slots: on a GPU, whose steps end requests in another order, a
    # sample can get its slot only after its siblings finished and has nothing to copy; C
    # and Python agree exactly either way.
    assert n_shared == [c.n_prompt_tokens_shared for c in flat[3:]]
    assert (max(n_shared) if ON_GPU else min(n_shared)) > 0
    assert any(ln.startswith("capi-gen: interrupted after 4 polls") for ln in lines)
    # Tools: C's forced call is Python's (same context shape, one prompt).
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    [call] = fastpar.generate_parallel(fastpar.Context(model, n_parallel=2, n_ctx_per_seq=1024),
                                       [[{"role": "user", "content": "What is the weather in Paris?"}]],
                                       tools=[weather], tool_choice="required", max_tokens=64, temperature=0.0)
    [tool] = call.tool_calls
    assert f"capi-gen: tool {tool.name} {tool.arguments}" in lines


def test_c_abi_survives_nulls_bad_sizes_freed_handles_and_malformed_files(model, tmp_path):
    import gguf
    import numpy as np

    binary = compile_c("capi_robust", tmp_path)
    malformed = tmp_path / "block_count_0.gguf"   # llama.cpp would abort on this one
    writer = gguf.GGUFWriter(str(malformed), "llama")
    writer.add_block_count(0)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_head_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(pathlib.Path(model.path).read_bytes()[:100_000])
    run = subprocess.run([str(binary), model.path, str(malformed), str(truncated)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == "robust: ok"
    n_cases = int(run.stdout.splitlines()[-2].split()[1])
    assert n_cases >= 70


def test_c_embed_equals_python_and_fails_bad_texts_alone(tmp_path_factory, model):
    import numpy as np

    lines = run_c("capi_embed", tmp_path_factory, model, "capi-embed: ok")
    errors = {int(ln.split()[2]): ln.split(" ", 3)[3] for ln in lines if ln.startswith("capi-embed: error ")}
    assert set(errors) == {7, 42, 77}
    assert "empty" in errors[7] and errors[42] == "text is not valid UTF-8" and "256 (n_batch)" in errors[77]
    # The same texts from Python (the invalid one replaced: Python's strings are valid UTF-8),
    # the same context: the same batches, so the same rows to printing precision.
    texts = [f"Sentence number {i} is about the sea." for i in range(100)]
    ctx = fastpar.Context(model, n_parallel=8, n_batch=256, embeddings=True, pooling="mean")
    texts[7], texts[42], texts[77] = "", "", "wwww " * 800
    rows = fastpar.embed(ctx, texts)
    for ln in lines:
        if ln.startswith("capi-embed: row "):
            i, dim, *values = ln.split()[2:]
            assert int(dim) == rows.shape[1]
            assert np.allclose([float(v) for v in values], rows[int(i)][:3], atol=2e-6 if ON_GPU else 1e-7), ln


def test_c_program_reranks_with_per_document_status(tmp_path_factory, tmp_path):
    from embedding_models import make_bert

    reranker = fastpar.Model(str(make_bert(tmp_path / "reranker.gguf", pooling="rank")), n_gpu_layers=N_GPU_LAYERS)
    lines = run_c("capi_rerank", tmp_path_factory, reranker, "capi-rerank: ok")
    errors = {int(ln.split()[2]): ln.split(" ", 3)[3] for ln in lines if ln.startswith("capi-rerank: error ")}
    assert set(errors) == {5, 13}
    assert errors[5] == "text is not valid UTF-8" and "tokens" in errors[13]
    # The same pairs from Python (the invalid document replaced by one that is also refused
    # before any batch), the same context options: the same batches, so the same scores to
    # printing precision.
    docs = [f"Document {i} says pandas eat bamboo {i % 7} times a day." for i in range(20)]
    docs[5] = docs[13] = "wwww " * 800
    want = fastpar.rerank(fastpar.Context(reranker, n_parallel=4, embeddings=True), "What do pandas eat?", docs)
    scores = {int(ln.split()[2]): float(ln.split()[3]) for ln in lines if ln.startswith("capi-rerank: score ")}
    assert sorted(scores) == [i for i in range(20) if i not in (5, 13)]
    for i, v in scores.items():
        assert abs(v - want[i]) <= (1e-4 if ON_GPU else 1e-6), (i, v, want[i])
