"""fastpar.ray on a local Ray cluster: every row as generate_parallel gives it, bad rows fail alone.

Marked ``ray`` (needs fastpar[ray]); deselect locally with -m "not ray".
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

import fastpar
from conftest import MORE_PROMPTS, ON_GPU, N_GPU_LAYERS, assert_same_greedy

pytestmark = [pytest.mark.ray,
              # Ray's own modules warn on import and at shutdown (deprecations, unclosed files)
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::ResourceWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]

N_CTX = 192
TOO_LONG = "word " * 400  # about 400 tokens, over n_ctx_per_seq=192
BAD_SCHEMA = {"oneOf": [{"type": "string"}, {"type": "integer"}]}  # a keyword fastpar refuses
SCHEMA = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "string", "maxLength": 12}}}


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")  # only reached when the `ray` marker is selected
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.verbose_stats_logs = False
    yield ray
    ray.shutdown()


TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"query": {"type": "string", "maxLength": 20}}, "required": ["query"]}}}


def _rows():
    """200 rows: raw prompts and chat messages, mixed options, two poison rows."""
    rows = []
    for i in range(200):
        text = f"{MORE_PROMPTS[i % len(MORE_PROMPTS)]} ({i})"
        row = {"id": i}
        if i % 2:
            row["messages"] = [{"role": "user", "content": text}]
        else:
            row["prompt"] = text
        sp = {"max_tokens": 3 + i % 4, "temperature": 0.0}
        if i % 5 == 1:
            sp.update(temperature=0.9, seed=i)  # seeded sampling: reproducible as well
        if i % 7 == 2:
            sp["stop"] = [" the"]
        if i % 11 == 3:
            sp["logprobs"] = True
        if i % 13 == 4:
            sp["reasoning"] = "split"  # these prompts do not think: an empty reasoning column
        if i % 23 == 5:
            sp.update(json_schema=json.dumps(SCHEMA), max_tokens=16)
        if i % 29 == 7 and "messages" in row:  # a forced call (tools as JSON text, as Arrow keeps them), greedy
            sp.update(tools=json.dumps([TOOL]), tool_choice="required", max_tokens=64, temperature=0.0)
            sp.pop("seed", None)
        row["sampling_params"] = sp
        rows.append(row)
    rows[17] = {"id": 17, "prompt": TOO_LONG, "sampling_params": {"max_tokens": 4, "temperature": 0.0}}
    rows[42] = {"id": 42, "prompt": "Name a city:",
                "sampling_params": {"max_tokens": 4, "json_schema": json.dumps(BAD_SCHEMA)}}
    return rows


def _reference(model, rows):
    """Each good row through generate_parallel, with the same options (and one thread, as
    each actor has)."""
    ctx = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=N_CTX, n_threads=1)
    good = [r for r in rows if r["id"] != 42]  # generate_parallel refuses the whole call for it
    prompts = [r.get("messages") or r["prompt"] for r in good]
    params = [fastpar.SamplingParams(**r["sampling_params"]) for r in good]
    return {r["id"]: c for r, c in zip(good, fastpar.generate_parallel(ctx, prompts, params))}


def test_processor_rows_match_generate_parallel(ray_cluster, model):
    import ray
    from fastpar.ray import FastparProcessorConfig, build_processor

    rows = _rows()
    config = FastparProcessorConfig(model.path, n_parallel=8, n_ctx_per_seq=N_CTX, n_gpu_layers=N_GPU_LAYERS,
                                    num_cpus=1, concurrency=2, batch_size=16, max_concurrent_batches=4)
    processor = build_processor(config, postprocess=lambda row: {**row, "answer_len": len(row["generated_text"])})
    out = processor(ray.data.from_items(rows, override_num_blocks=8)).take_all()

    assert sorted(r["id"] for r in out) == list(range(200))
    ref = _reference(model, rows)
    by_id = {r["id"]: r for r in out}
    for i, row in by_id.items():
        src = rows[i]
        # input columns kept
        assert row["sampling_params"]["max_tokens"] == src["sampling_params"]["max_tokens"]
        assert row.get("prompt") == src.get("prompt") and row.get("messages") == src.get("messages")
        if i == 42:
            assert row["finish_reason"] == "error" and "oneOf" in row["__inference_error__"], row
            assert row.get("answer_len") is None  # error rows skip postprocess, as in ray.data.llm
            continue
        want = ref[i]
        if i == 17:
            assert want.finish_reason == "error"
            assert row["finish_reason"] == "error" and row["__inference_error__"] == want.error
            assert f"n_ctx_per_seq={N_CTX}" in row["__inference_error__"]
            continue
        assert row["__inference_error__"] == "", row
        if src["sampling_params"].get("tools"):
            # The tool_calls column. Not compared token for token with generate_parallel:
            # these prompts (about 100 tokens) share the tools' system message, and a
            # copied prefix of 64 tokens or more rounds apart from a decoded one, so which
            # rows share a batch changes them (docs/internals.md, "Prefix sharing"; seen:
            # 39 against 42 tokens, greedy). The shorter rows here round alike.
            assert row["finish_reason"] in ("tool_calls", "length")
            assert all(t["type"] == "function" and t["function"]["name"] == "lookup" for t in row["tool_calls"])
            assert (row["finish_reason"] == "tool_calls") == bool(row["tool_calls"])
            continue
        assert row["finish_reason"] == want.finish_reason, (i, row, want)
        assert row["num_input_tokens"] == want.n_prompt_tokens + want.n_prompt_tokens_shared
        assert row["num_generated_tokens"] == want.n_gen_tokens
        assert row["answer_len"] == len(row["generated_text"])
        if ON_GPU:
            continue
        assert row["generated_text"] == want.text, (i, row, want)
        if src["sampling_params"].get("logprobs"):
            assert row["logprobs"] == pytest.approx(list(want.logprobs))
        if src["sampling_params"].get("reasoning"):
            assert row["reasoning"] == want.reasoning
        if "json_schema" in src["sampling_params"] and want.finish_reason == "stop":
            assert "answer" in json.loads(row["generated_text"])


def test_samples_are_list_columns(ray_cluster, model):
    """Config n > 1: every output column is a list with one entry per sample, the samples
    generate_parallel gives (sample j seeded seed + j)."""
    import ray
    from fastpar.ray import FastparProcessorConfig, build_processor

    prompts = ["Name a colour:", "A good name for a dog is", "The sky is"]
    config = FastparProcessorConfig(model.path, n_parallel=4, n_ctx_per_seq=N_CTX, n_gpu_layers=N_GPU_LAYERS,
                                    concurrency=1, batch_size=2,
                                    sampling_params={"n": 3, "seed": 5, "max_tokens": 4, "temperature": 0.9})
    rows = [{"prompt": p} for p in prompts] + [{"prompt": prompts[0], "sampling_params": {"n": 1}}]
    out = build_processor(config)(ray.data.from_items(rows)).take_all()
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=N_CTX)
    want = fastpar.generate_parallel(ctx, prompts + [prompts[0]],
                                     [fastpar.SamplingParams(**config.sampling_params)] * 3
                                     + [fastpar.SamplingParams(**{**config.sampling_params, "n": 1})])
    got = {(r["prompt"], len(r["generated_text"])): r for r in out}
    for p, samples in zip(prompts + [prompts[0]], want):
        row = got[(p, len(samples))]
        assert row["__inference_error__"] == ""
        assert row["finish_reason"] == [c.finish_reason for c in samples]
        assert row["num_generated_tokens"] == [c.n_gen_tokens for c in samples]
        if not ON_GPU:
            assert row["generated_text"] == [c.text for c in samples]


def test_plain_callable_class_in_map_batches(ray_cluster, model):
    """FastparPredictor, for users who write map_batches themselves."""
    import ray
    from fastpar.ray import FastparPredictor, FastparProcessorConfig

    prompts = MORE_PROMPTS[:10]
    config = FastparProcessorConfig(model.path, n_parallel=4, n_ctx_per_seq=N_CTX, n_gpu_layers=N_GPU_LAYERS,
                                    sampling_params={"max_tokens": 5, "temperature": 0.0})
    ds = ray.data.from_items([{"prompt": p, "row": i} for i, p in enumerate(prompts)])
    out = ds.map_batches(FastparPredictor, fn_constructor_kwargs={"config": config}, concurrency=1, num_cpus=1,
                         batch_size=4).take_all()
    ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=N_CTX)
    want = fastpar.generate_parallel(ctx, prompts, max_tokens=5, temperature=0.0)
    assert sorted(r["row"] for r in out) == list(range(10))
    for r in out:
        assert r["__inference_error__"] == "" and r["num_generated_tokens"] == want[r["row"]].n_gen_tokens
        if not ON_GPU:
            assert r["generated_text"] == want[r["row"]].text


def test_embed_task_gives_an_embeddings_column(ray_cluster, model):
    """task="embed": each row's vector equals fastpar.embed's (within the rounding of other
    batch shapes), a bad row gets its error column, through the processor and the plain
    callable class alike."""
    import numpy as np
    import ray
    from fastpar.ray import FastparPredictor, FastparProcessorConfig, build_processor

    # One bad text (the last) among 100.
    texts = [f"{MORE_PROMPTS[i % len(MORE_PROMPTS)]} ({i})" for i in range(99)] + [""]
    want = fastpar.embed(fastpar.Context(model, n_parallel=4, embeddings=True), texts)
    config = FastparProcessorConfig(model.path, n_parallel=4, n_gpu_layers=N_GPU_LAYERS, task="embed",
                                    batch_size=25, max_concurrent_batches=2)
    rows = [{"prompt": t, "row": i} for i, t in enumerate(texts)]
    for out in (build_processor(config)(ray.data.from_items(rows)).take_all(),
                ray.data.from_items(rows).map_batches(FastparPredictor, fn_constructor_kwargs={"config": config},
                                                      concurrency=1, num_cpus=1, batch_size=25).take_all()):
        by_row = {r["row"]: r for r in out}
        assert sorted(by_row) == list(range(len(texts)))
        bad = by_row[len(texts) - 1]
        assert bad["embeddings"] is None and "empty" in bad["__inference_error__"]
        got = np.array([by_row[i]["embeddings"] for i in range(len(texts) - 1)], dtype=np.float64)
        want_ok = np.asarray(want[:-1], dtype=np.float64)
        cos = np.sum(got * want_ok, 1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want_ok, axis=1))
        assert cos.min() >= (0.995 if ON_GPU else 0.9995)  # tests/test_embeddings.py's COS_SHAPES says why
        assert all(by_row[i]["num_input_tokens"] > 0 and by_row[i]["__inference_error__"] == ""
                   for i in range(len(texts) - 1))
    with pytest.raises(ValueError, match="sampling_params does not apply"):
        FastparProcessorConfig(model.path, task="embed", sampling_params={"max_tokens": 3})
    with pytest.raises(ValueError, match="task must be"):
        FastparProcessorConfig(model.path, task="classify")


def test_prefix_cache_reuses_a_prefix_across_batches(model):
    """An actor's engine with the prefix cache keeps what one batch decoded for the next: a
    few-shot prefix is decoded once. (The predictor alone, in this process: no cluster.)"""
    pytest.importorskip("ray")
    import numpy as np
    from fastpar.ray import FastparPredictor, FastparProcessorConfig

    prefix = "Answer with one word. " + " ".join(["The sky is blue; grass is green."] * 12) + " Q: "
    config = FastparProcessorConfig(model.path, n_parallel=2, n_ctx_per_seq=N_CTX, n_gpu_layers=N_GPU_LAYERS,
                                    prefix_cache_mib=-1, sampling_params={"max_tokens": 4, "temperature": 0.0})
    predictor = FastparPredictor(config)
    try:
        for batch in (["What colour is the sky?", "What colour is grass?"], ["What colour is snow?"]):
            out = predictor({"prompt": np.array([prefix + q for q in batch])})
            assert list(out["__inference_error__"]) == [""] * len(batch)
        stats = predictor.engine.prefix_cache_stats()
        assert stats.n_hits >= 1 and stats.n_tokens_reused >= len(model.tokenize(prefix)) - 2
    finally:
        predictor.engine.close()


def test_stop_on_error_fails_the_job_with_the_rows_message(ray_cluster, model):
    import ray
    from fastpar.ray import FastparProcessorConfig, build_processor

    config = FastparProcessorConfig(model.path, n_parallel=4, n_ctx_per_seq=N_CTX, n_gpu_layers=N_GPU_LAYERS,
                                    should_continue_on_error=False, sampling_params={"max_tokens": 2})
    rows = [{"prompt": "Hello"}, {"prompt": TOO_LONG}, {"prompt": "Goodbye"}]
    with pytest.raises(Exception, match=f"n_ctx_per_seq={N_CTX}"):
        build_processor(config)(ray.data.from_items(rows)).take_all()


def test_config_is_checked_before_any_work(model):
    pytest.importorskip("ray")
    from fastpar.ray import FastparProcessorConfig

    with pytest.raises(ValueError, match="min <= max"):
        FastparProcessorConfig(model.path, concurrency=(3, 2))
    with pytest.raises(TypeError, match="max_new_tokens"):
        FastparProcessorConfig(model.path, sampling_params={"max_new_tokens": 3})
    with pytest.raises(ValueError, match="batch_size"):
        FastparProcessorConfig(model.path, batch_size=0)
    with pytest.raises(ValueError, match="prefix_cache_mib"):
        FastparProcessorConfig(model.path, prefix_cache_mib=-2)
    with pytest.raises(TypeError, match="prefix_cache_mib"):
        FastparProcessorConfig(model.path, prefix_cache_mib="auto")
    config = FastparProcessorConfig(model.path, concurrency=[1, 4], num_cpus=2, num_gpus=1)
    kwargs = config._map_batches_kwargs()
    assert (kwargs["compute"].min_size, kwargs["compute"].max_size) == (1, 4)
    assert kwargs["num_cpus"] == 2 and kwargs["num_gpus"] == 1
    assert 8 in (kwargs.get("max_concurrency"), getattr(kwargs["compute"], "max_concurrent_calls_per_actor", None))


def test_missing_model_is_refused_when_the_config_is_made(tmp_path, monkeypatch):
    """A model path that is not a file fails on the driver, naming the path and the way out,
    not in every actor inside Ray's output; no Ray cluster is needed to see it."""
    pytest.importorskip("ray")
    from fastpar.ray import FastparProcessorConfig

    missing = tmp_path / "no-such-model.gguf"
    with pytest.raises(FileNotFoundError, match=re.escape(repr(str(missing)))) as e:
        FastparProcessorConfig(str(missing), num_cpus=2)
    assert "does not exist" in str(e.value) and "check_model_source=False" in str(e.value)
    with pytest.raises(ValueError, match="is not a file"):
        FastparProcessorConfig(str(tmp_path))

    # A relative path is taken from the driver's working folder and handed on absolute;
    # a path object is accepted as its text.
    model_file = tmp_path / "m.gguf"
    model_file.write_bytes(b"GGUF")
    monkeypatch.chdir(tmp_path)
    for given in ("m.gguf", model_file):
        source = FastparProcessorConfig(given).model_source
        assert isinstance(source, str) and os.path.isabs(source) and os.path.samefile(source, model_file)

    # A file only the worker nodes have: not checked, passed on as given.
    config = FastparProcessorConfig("/models/on-the-workers.gguf", check_model_source=False)
    assert config.model_source == "/models/on-the-workers.gguf"
    with pytest.raises(TypeError, match="check_model_source"):
        FastparProcessorConfig(str(model_file), check_model_source="no")


@pytest.mark.filterwarnings("default")
def test_import_without_ray_names_the_extra():
    code = "import sys; sys.modules['ray'] = None\ntry:\n import fastpar.ray\nexcept ImportError as e:\n print(e)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'fastpar[ray]'" in out
