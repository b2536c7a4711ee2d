"""fastpar.embed: one pooled vector per text, held against llama.cpp's own llama-embedding,
for a decoder (the default model) and encoders (BERT-kind and nomic-bert models made at test
time)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import fastpar
from conftest import MORE_PROMPTS, N_GPU_LAYERS, ON_GPU, assert_empty
from embedding_models import make_bert
from llama_tools import llama_tool

# Cosine similarity a row must reach against its reference computed in the same batch shapes,
# and an encoder's against any (measured: 1 - 1e-7 and better; a real bug moves it by far more).
COS = 0.9999
# A decoder's vector computed in other batch shapes: llama.cpp picks attention kernels by the
# rows a batch holds (its CPU flash attention, its CUDA kernels), they round apart, and the
# default model's 30 causal layers carry the difference to the pooled vector. Measured
# minimum over 40 texts: 0.99983 on the CPU, 0.9979 on an H200 (flash attention off would
# give 0.99998 on the CPU at 3.3x the time; docs/api.md).
COS_SHAPES = 0.995 if ON_GPU else 0.9995

TEXTS = [
    "The capital of France is Paris.",
    "Dogs are loyal animals and good friends.",
    "A quick brown fox jumps over the lazy dog near the river bank in the early morning.",
    "import numpy as np",
    "Rain is caused by water vapour condensing into droplets heavy enough to fall.",
]


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return np.sum(a * b, axis=-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def llama_embedding(model_path: str, texts, pooling: str, n_threads: int) -> np.ndarray:
    """llama.cpp's llama-embedding on the same texts (one per line, all in one batch) at its
    defaults, normalized as fastpar's default."""
    cmd = [llama_tool("llama-embedding"), "-m", model_path, "-p", "\n".join(texts),
           "--pooling", pooling, "--embd-normalize", "2", "--embd-output-format", "json",
           "-c", "2048", "-b", "2048", "-ub", "2048", "-t", str(n_threads), "-ngl", str(N_GPU_LAYERS)]
    # llama-embedding prints through llama.cpp's asynchronous logger, which its main() left
    # mid-queue at exit (a fifth of runs cut the JSON short); scripts/llama-patches/0004 makes
    # it write the queue out first, so one run's JSON is whole.
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout[out.stdout.index("{"):])
    return np.array([d["embedding"] for d in sorted(doc["data"], key=lambda d: d["index"])], dtype=np.float32)


@pytest.fixture(scope="module")
def bert_path(tmp_path_factory) -> str:
    return str(make_bert(tmp_path_factory.mktemp("bert") / "bert-cls.gguf", pooling="cls"))


@pytest.fixture(scope="module")
def bert(bert_path) -> fastpar.Model:
    return fastpar.Model(bert_path, n_gpu_layers=N_GPU_LAYERS)


@pytest.fixture(scope="module")
def nomic(tmp_path_factory) -> fastpar.Model:
    """nomic-embed's kind (rotary positions, fused QKV, gated SiLU; mean pooling)."""
    path = make_bert(tmp_path_factory.mktemp("nomic") / "nomic-mean.gguf", pooling="mean", arch="nomic-bert")
    return fastpar.Model(str(path), n_gpu_layers=N_GPU_LAYERS)


@pytest.fixture
def embedding_model(request) -> fastpar.Model:
    """The model a test's parameter names: "decoder" (the default model), "bert", "nomic-bert"."""
    return request.getfixturevalue({"decoder": "model", "bert": "bert", "nomic-bert": "nomic"}[request.param])


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_decoder_rows_equal_llama_embedding(model, pooling):
    # Five texts on four slots: the fifth is decoded alone, where llama-embedding decodes all
    # five together; on the CPU that still rounds alike, on a GPU by COS_SHAPES.
    ctx = fastpar.Context(model, n_parallel=4, embeddings=True, pooling=pooling)
    ours = fastpar.embed(ctx, TEXTS)
    theirs = llama_embedding(model.path, TEXTS, pooling, ctx.n_threads)
    assert ours.shape == theirs.shape == (len(TEXTS), 576)  # the default model's width
    assert ours.dtype == np.float32 and ours.errors == {}
    assert cosine(ours, theirs).min() >= (COS_SHAPES if ON_GPU else COS), cosine(ours, theirs)
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    assert_empty(ctx)


@pytest.mark.parametrize("embedding_model, pooling, own", [("bert", None, "cls"), ("bert", "mean", "cls"),
                                                          ("nomic-bert", None, "mean"), ("nomic-bert", "cls", "mean")],
                         indirect=["embedding_model"])
def test_encoder_rows_equal_llama_embedding(embedding_model, pooling, own):
    ctx = fastpar.Context(embedding_model, n_parallel=4, embeddings=True, pooling=pooling)
    assert ctx.pooling == (pooling or own)  # None: the model's own (its GGUF's)
    ours = fastpar.embed(ctx, TEXTS)
    theirs = llama_embedding(embedding_model.path, TEXTS, ctx.pooling, ctx.n_threads)
    assert ours.errors == {} and ours.shape == theirs.shape == (len(TEXTS), 64)
    assert cosine(ours, theirs).min() >= COS, cosine(ours, theirs)
    # The bound tells texts apart: different texts' rows are 10x further apart than it allows.
    assert cosine(ours[:1], ours[1:]).max() < 1 - 10 * (1 - COS)


@pytest.mark.parametrize("embedding_model, bound", [("decoder", COS_SHAPES), ("bert", COS), ("nomic-bert", COS)],
                         indirect=["embedding_model"])
def test_a_batch_of_many_equals_each_text_alone(embedding_model, bound):
    texts = [f"{p} ({i})" * (1 + i % 4) for i, p in enumerate(MORE_PROMPTS + MORE_PROMPTS)]
    ctx = fastpar.Context(embedding_model, n_parallel=8, embeddings=True)
    many = fastpar.embed(ctx, texts)
    # Several steps, refilled: more texts than slots and than one batch holds at once.
    assert ctx.last_stats.n_decode_calls > 1 and ctx.last_stats.n_prompts == len(texts)
    alone = np.stack([fastpar.embed(ctx, [t])[0] for t in texts])
    assert cosine(many, alone).min() >= bound
    assert_empty(ctx)


ANY_SLOTS = """
import sys, numpy as np, fastpar
model = fastpar.Model(sys.argv[1], n_gpu_layers=int(sys.argv[2]))
texts = sys.argv[4:]
n_batch = fastpar.Context(model, n_parallel=1, embeddings=True).n_batch  # 2,048, or the model's context
for n in (1, 3, 5, 6, 7):
    ctx = fastpar.Context(model, n_parallel=n, embeddings=True, pooling="mean")  # the pooling that aborted
    rows = fastpar.embed(ctx, texts)
    assert rows.errors == {} and rows.shape[0] == len(texts) and ctx.n_batch == n_batch, (n, rows.errors, ctx.n_batch)
    np.save(f"{sys.argv[3]}/{n}.npy", np.asarray(rows))
"""


@pytest.mark.parametrize("embedding_model, bound", [("decoder", COS_SHAPES), ("bert", COS)],
                         indirect=["embedding_model"])
def test_any_number_of_slots_makes_an_embeddings_context(embedding_model, bound, tmp_path):
    # llama.cpp reserves a step's graph for n_batch tokens rounded up to a multiple of the
    # sequences but its pooled rows for n_batch, and aborted the process on the mismatch
    # (n_parallel 3, 5, 6 or 7 against an n_batch of 2,048 or 512). In a subprocess, so
    # that a regression fails this test alone.
    proc = subprocess.run([sys.executable, "-c", ANY_SLOTS, embedding_model.path, str(N_GPU_LAYERS), str(tmp_path),
                           *TEXTS], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {n: np.load(tmp_path / f"{n}.npy") for n in (1, 3, 5, 6, 7)}
    # One text a step (n_parallel=1) against all in one: batch shapes apart.
    for n in (3, 5, 6, 7):
        assert cosine(rows[n], rows[1]).min() >= bound, n


def test_a_bad_text_fails_alone(model):
    ctx = fastpar.Context(model, n_parallel=8, n_batch=256, embeddings=True)
    texts = [f"Sentence number {i} is about {MORE_PROMPTS[i % len(MORE_PROMPTS)]}" for i in range(100)]
    bad = {7: "", 42: "word " * 400, 77: [1, 2, model.n_vocab + 5]}
    mixed = [bad.get(i, t) for i, t in enumerate(texts)]
    got = fastpar.embed(ctx, mixed)
    assert set(got.errors) == set(bad)
    assert "empty" in got.errors[7]
    assert "256 (n_batch)" in got.errors[42]
    assert "not a token id" in got.errors[77]
    assert np.isnan(got[list(bad)]).all()
    good = [i for i in range(100) if i not in bad]
    assert np.isfinite(got[good]).all()
    clean = fastpar.embed(ctx, [texts[i] for i in good])
    assert cosine(got[good], clean).min() >= COS_SHAPES  # other batch shapes
    assert_empty(ctx)


def test_inputs_options_and_results(model):
    ctx = fastpar.Context(model, n_parallel=2, embeddings=True)
    text = TEXTS[0]
    by_text = fastpar.embed(ctx, [text])
    by_ids = fastpar.embed(ctx, [model.tokenize(text)])
    assert cosine(by_text, by_ids)[0] >= COS
    raw = fastpar.embed(ctx, [text], normalize=False)
    assert abs(np.linalg.norm(raw[0]) - 1.0) > 1e-3  # really not normalized
    assert cosine(raw, by_text)[0] >= COS
    seen = []
    rows = fastpar.embed(ctx, TEXTS, progress=True, on_completion=lambda i, c: seen.append((i, len(c.embedding))))
    assert sorted(seen) == [(i, rows.shape[1]) for i in range(len(TEXTS))]
    assert rows[1:3].errors == {} and isinstance(rows[1:3], fastpar.Embeddings)
    assert fastpar.embed(ctx, []).shape == (0, rows.shape[1])


def test_wrong_uses_raise_clear_errors(model):
    emb = fastpar.Context(model, n_parallel=1, embeddings=True, pooling="mean")
    gen = fastpar.Context(model, n_parallel=1)
    with pytest.raises(ValueError, match="made for embeddings"):
        fastpar.generate_parallel(emb, ["Hello"], max_tokens=2)
    with pytest.raises(ValueError, match="made for generation"):
        fastpar.embed(gen, ["Hello"])
    with pytest.raises(ValueError, match="pools by 'mean'"):
        fastpar.embed(emb, ["Hello"], pooling="last")
    with pytest.raises(ValueError, match="pooling must be one of"):
        fastpar.Context(model, embeddings=True, pooling="max")
    with pytest.raises(ValueError, match="set embeddings too"):
        fastpar.Context(model, pooling="mean")
    with pytest.raises(ValueError, match="keeps no prefix cache"):
        fastpar.Context(model, embeddings=True, prefix_cache_mib=64)
    with pytest.raises(TypeError, match="must be a sequence"):
        fastpar.embed(emb, "one string, not a list")
    assert gen.pooling is None and emb.pooling == "mean" and emb.embeddings and not gen.embeddings


def test_engine_embeds_texts_from_many_threads(model):
    """Texts submitted from several threads share the engine's steps; each vector equals the
    one fastpar.embed makes, and a bad text fails alone."""
    from concurrent.futures import ThreadPoolExecutor

    texts = [f"{p} ({i})" for i, p in enumerate(MORE_PROMPTS)] + [""]
    want = fastpar.embed(fastpar.Context(model, n_parallel=4, embeddings=True), texts)
    with fastpar.Engine(model, n_parallel=4, embeddings=True) as engine:
        assert engine.embeddings and engine.pooling == "mean"
        with ThreadPoolExecutor(4) as pool:
            done = list(pool.map(lambda t: engine.submit_embedding(t, block=True).result(timeout=120), texts))
        with pytest.raises(ValueError, match="made for embeddings"):
            engine.submit("Hello", max_tokens=2)
        stats = engine.stats()
    assert [c.finish_reason for c in done] == ["stop"] * (len(texts) - 1) + ["error"]
    assert done[-1].error == want.errors[len(texts) - 1]
    got = np.array([c.embedding for c in done[:-1]], dtype=np.float32)
    assert cosine(got, want[:-1]).min() >= COS_SHAPES  # other batch shapes
    assert stats.n_completed == len(texts) - 1 and stats.n_failed == 1
    with fastpar.Engine(model, n_parallel=1) as generating:
        with pytest.raises(ValueError, match="made for generation"):
            generating.submit_embedding("Hello")


def hundred_with_one_empty(texts: list) -> list:
    """100 inputs cycling through `texts`, number 42 empty."""
    hundred = [texts[i % len(texts)] for i in range(100)]
    hundred[42] = ""
    return hundred


def assert_only_the_empty_one_failed(data: list, want) -> None:
    """OpenAI-shaped entries for hundred_with_one_empty(texts), `want` the texts' rows: entry
    42 has a null embedding and its error, every other one its text's vector (within the
    rounding of other batch shapes) and no error."""
    assert data[42]["embedding"] is None and "empty" in data[42]["error"]["message"]
    good = [i for i in range(100) if i != 42]
    assert all("error" not in data[i] for i in good)
    rows = np.array([data[i]["embedding"] for i in good])
    assert cosine(rows, want[[i % len(want) for i in good]]).min() >= COS_SHAPES


def test_v1_embeddings_through_the_openai_client(model):
    """OpenAI's schema through its own client (which asks for base64 and decodes it), plain
    floats and token arrays, per-item errors, concurrent clients, and the refusals."""
    import asyncio

    import httpx
    import openai

    from fastpar.server import create_app
    from test_server import running

    texts = [f"{p} ({i})" for i, p in enumerate(MORE_PROMPTS)]
    want = fastpar.embed(fastpar.Context(model, n_parallel=4, embeddings=True), texts)
    with fastpar.Engine(model, n_parallel=4, embeddings=True) as engine, running(create_app(engine)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        got = client.embeddings.create(model="m", input=texts)
        assert [d.index for d in got.data] == list(range(len(texts)))
        assert cosine(np.array([d.embedding for d in got.data]), want).min() >= COS_SHAPES  # other batch shapes
        assert got.usage.prompt_tokens == sum(len(model.tokenize(t)) for t in texts)
        floats = client.embeddings.create(model="m", input=texts[0], encoding_format="float")
        assert cosine(np.array(floats.data[0].embedding), want[0]) >= COS_SHAPES  # other batch shapes
        ids = client.embeddings.create(model="m", input=[model.tokenize(texts[1])], encoding_format="float")
        assert cosine(np.array(ids.data[0].embedding), want[1]) >= COS_SHAPES  # other batch shapes

        async def many():
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as a:
                return await asyncio.gather(*(a.embeddings.create(model="m", input=t) for t in texts * 2))

        for r, w in zip(asyncio.run(many()), np.concatenate([want, want])):
            assert cosine(np.array(r.data[0].embedding), w) >= COS_SHAPES  # other batch shapes

        mixed = httpx.post(url + "/v1/embeddings", json={"input": [texts[0], ""]}).json()
        assert mixed["data"][1]["embedding"] is None and "empty" in mixed["data"][1]["error"]["message"]
        assert len(mixed["data"][0]["embedding"]) == want.shape[1]
        # One bad text among 100 fails alone: a per-item error in OpenAI's shape, the rest embedded.
        data = httpx.post(url + "/v1/embeddings", json={"input": hundred_with_one_empty(texts),
                                                        "encoding_format": "float"}, timeout=120).json()["data"]
        assert [d["index"] for d in data] == list(range(100))
        assert_only_the_empty_one_failed(data, want)
        for body, why in (({"input": [""]}, "input 0: text is empty"), ({"input": []}, "'input' must be"),
                          ({"input": "x", "dimensions": 8}, "cannot be shortened"),
                          ({"input": "x", "encoding_format": "hex"}, "'encoding_format'")):
            r = httpx.post(url + "/v1/embeddings", json=body)
            assert r.status_code == 400 and why in r.json()["error"]["message"], (body, r.text)
        r = httpx.post(url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 2})
        assert r.status_code == 400 and "serves embeddings" in r.json()["error"]["message"]
    with fastpar.Engine(model, n_parallel=1) as generating, running(create_app(generating)) as url:
        r = httpx.post(url + "/v1/embeddings", json={"input": "Hello"})
        assert r.status_code == 400 and "--embeddings" in r.json()["error"]["message"]


def test_fastpar_run_answers_embedding_lines(model, tmp_path):
    """A batch file mixing embedding and completion lines: a run with --embeddings answers the
    first kind (rows as fastpar.embed's), the completions fail naming the option, and a rerun
    without it answers them into the same output."""
    import base64
    import json

    from test_server import _batch_cmd, _batch_line, _records

    texts = [f"{p} ({i})" for i, p in enumerate(MORE_PROMPTS[:6])]
    want = fastpar.embed(fastpar.Context(model, n_parallel=4, embeddings=True), texts)
    lines = [json.dumps({"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
                         "body": {"input": t, "model": "m"}}) for i, t in enumerate(texts[:4])]
    lines.append(json.dumps({"custom_id": "pair", "method": "POST", "url": "/v1/embeddings",
                             "body": {"input": texts[4:], "encoding_format": "base64"}}))
    lines.append(json.dumps({"custom_id": "half", "method": "POST", "url": "/v1/embeddings",
                             "body": {"input": [texts[0], ""]}}))
    lines.append(json.dumps({"custom_id": "empty", "method": "POST", "url": "/v1/embeddings", "body": {"input": ""}}))
    lines.append(json.dumps({"custom_id": "hundred", "method": "POST", "url": "/v1/embeddings",
                             "body": {"input": hundred_with_one_empty(texts)}}))
    lines.append(_batch_line("gen"))
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(lines) + "\n")
    cmd = _batch_cmd(model, src, out, "--n-parallel", "4", "--embeddings")
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert first.returncode == 1 and "7 answered, 2 failed" in first.stderr.splitlines()[-1], first.stderr
    got = _records(out)
    for i in range(4):
        body = got[f"e{i}"]["response"]["body"]
        assert body["model"] == "m" and body["usage"]["prompt_tokens"] > 0
        assert cosine(np.array(body["data"][0]["embedding"]), want[i]) >= COS_SHAPES
    pair = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in got["pair"]["response"]["body"]["data"]]
    assert cosine(np.array(pair), want[4:]).min() >= COS_SHAPES
    half = got["half"]["response"]["body"]["data"]
    assert half[0]["embedding"] is not None and half[1]["embedding"] is None and "empty" in half[1]["error"]["message"]
    # One bad text among 100 in a line fails alone; the line is answered.
    assert_only_the_empty_one_failed(got["hundred"]["response"]["body"]["data"], want)
    assert got["empty"]["response"]["status_code"] == 400
    assert got["gen"]["error"]["message"] == "a generation line: run without --embeddings to answer it"
    again = subprocess.run(_batch_cmd(model, src, out, "--n-parallel", "4"), capture_output=True, text=True,
                           timeout=300)
    assert "1 answered, 1 failed, 7 already in" in again.stderr.splitlines()[-1], again.stderr
    assert _records(out)["gen"]["response"]["status_code"] == 200


def test_a_text_longer_than_a_step_embeds_in_a_step_of_its_own(model):
    # A CPU step packs texts up to 512 tokens (attention spans a step's tokens, so larger
    # steps cost more); a longer text, up to n_batch, takes a step of its own. A GPU step
    # packs up to 1,024, so there all four (about 890 tokens) share one step.
    long_text = " ".join(f"word{i % 50}" for i in range(300))
    texts = [TEXTS[0], long_text, TEXTS[1], TEXTS[2]]
    assert 512 < len(model.tokenize(long_text)) <= 1024
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=1024, embeddings=True)
    assert ctx.n_batch == 1024
    got = fastpar.embed(ctx, texts)
    assert got.errors == {}
    assert ctx.last_stats.n_decode_calls == (1 if ON_GPU else 2)
    alone = np.stack([fastpar.embed(ctx, [t])[0] for t in texts])
    assert cosine(got, alone).min() >= COS_SHAPES
    assert_empty(ctx)
