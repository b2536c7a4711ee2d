"""The command line: the demo names its model; a user's mistake is one line, not a traceback; no
option is taken for another one's abbreviation; `serve` and `run` check their options before
they start and share their defaults."""

from __future__ import annotations

import subprocess
import sys

import pytest

import fastpar


def fastpar_cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastpar", *args], capture_output=True, text=True, timeout=timeout)


def test_demo_names_the_default_model(model):
    if model.path != fastpar.default_model_path():
        pytest.skip("the tests run another model")
    run = fastpar_cli("demo", "--max-tokens", "4", "--n-parallel", "4", "--n-ctx-per-seq", "256")
    assert run.returncode == 0, run.stderr[-2000:]
    first = run.stdout.splitlines()[0]
    assert first.startswith(f"fastpar {fastpar.__version__} (") and first.endswith("model SmolLM2-135M-Instruct (Q4_1)")
    assert model.description not in run.stdout  # llama.cpp's "llama 256M Q4_1" is not its name


@pytest.mark.parametrize("args, message", [
    (["--model", "/no/such/model.gguf"], "model file not found: '/no/such/model.gguf'"),
    (["--n-parallel", "0"], "n_parallel must be between 1 and 256, got 0"),
    (["--model", "GARBAGE"], "failed to load model"),
])
def test_mistakes_are_one_line_not_a_traceback(model, tmp_path, args, message):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf file" * 100)
    args = [str(garbage) if a == "GARBAGE" else a for a in args]
    run = fastpar_cli("demo", *args)
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("fastpar: error: ") and message in last, run.stderr


def test_usage_mistakes_exit_with_status_2():
    run = fastpar_cli("demo", "--n-parallel", "many")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "fastpar demo: error: argument --n-parallel: invalid int value: 'many'" in run.stderr


def test_serve_takes_model_as_run_does_and_no_abbreviations(capsys):
    from fastpar.__main__ import _parse

    assert _parse(["serve", "--model", "m.gguf"]).model == "m.gguf"
    assert _parse(["serve", "m.gguf"]).model == "m.gguf"
    assert _parse(["serve", "m.gguf", "--model", "m.gguf"]).model == "m.gguf"
    assert _parse(["serve", "--model-name", "smol"]).model is None
    for argv, message in [
        (["serve", "a.gguf", "--model", "b.gguf"], "two models given: a.gguf and --model b.gguf"),
        # an abbreviation is an unknown option, never another one's prefix
        (["serve", "--model-n", "smol"], "unrecognized arguments: --model-n"),
        (["run", "in.jsonl", "-o", "out.jsonl", "--lim", "3"], "unrecognized arguments: --lim 3"),
        (["serve", "--shutdown", "3"], "unrecognized arguments: --shutdown"),
    ]:
        with pytest.raises(SystemExit) as e:
            _parse(argv)
        assert e.value.code == 2, argv
        assert message in capsys.readouterr().err, argv


def test_serve_and_run_share_their_defaults():
    # One n_ctx_per_seq for both doors (docs/server.md): the same request file behaves the
    # same through either; the library's Context keeps its own, smaller default.
    from fastpar.__main__ import _parse
    from fastpar.server.protocol import N_CTX_PER_SEQ

    serve = _parse(["serve"])
    run = _parse(["run", "in.jsonl", "-o", "out.jsonl"])
    for option in ("n_ctx_per_seq", "n_parallel", "n_gpu_layers", "n_threads", "model", "model_name", "type_k",
                   "type_v", "kv_unified"):
        assert getattr(serve, option) == getattr(run, option), option
    assert serve.n_ctx_per_seq == N_CTX_PER_SEQ == 4096


@pytest.mark.parametrize("args, message", [
    (["--n-parallel", "0"], "n_parallel must be between 1 and 256, got 0"),
    (["--n-ctx-per-seq", "1"], "n_ctx_per_seq must be at least 2"),
    (["--n-threads", "0"], "n_threads must be positive"),
    (["--n-gpu-layers", "-2"], "n_gpu_layers must be -1 (all), 0 or positive, got -2"),
    (["--max-queued", "0"], "max_queued must be >= 1"),
    (["--port", "70000"], "port must be between 1 and 65535, got 70000"),
    (["--shutdown-timeout", "-1"], "shutdown_timeout must be a number of seconds >= 0, got -1.0"),
    (["--stream-interval", "0"], "stream_interval must be an integer >= 1, got 0"),
    (["--model", "/no/such/model.gguf"], "no such model file: /no/such/model.gguf"),
    (["--type-k", "q3"], 'type_k must be one of "f16", "bf16", "f32", "q8_0", "q4_0", got "q3"'),
    (["--type-v", "int8"], 'type_v must be one of'),
    (["--pooling", "mean"], "pooling applies to an embeddings context: set embeddings too"),
])
def test_serve_checks_its_options_before_it_starts(monkeypatch, capsys, args, message):
    import uvicorn

    from fastpar.__main__ import main

    def started(*a, **k):
        raise AssertionError("the server started")

    monkeypatch.setattr(uvicorn.Server, "run", started)
    assert main(["serve", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fastpar: error: ") and message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("args, message", [
    (["--n-parallel", "0"], "n_parallel must be between 1 and 256, got 0"),
    (["--n-ctx-per-seq", "1"], "n_ctx_per_seq must be at least 2"),
    (["--model", "/no/such/model.gguf"], "no such model file: /no/such/model.gguf"),
    (["--type-v", "q4"], 'type_v must be one of "f16", "bf16", "f32", "q8_0", "q4_0", got "q4"'),
])
def test_run_checks_its_options_before_it_loads(monkeypatch, capsys, tmp_path, args, message):
    from fastpar.__main__ import main

    def loaded(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(fastpar, "Model", loaded)
    src = tmp_path / "in.jsonl"
    src.write_text("")
    assert main(["run", str(src), "-o", str(tmp_path / "out.jsonl"), *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fastpar: error: ") and message in err, err


def test_kv_cache_types_reach_the_engine_and_the_context(monkeypatch, tmp_path):
    # serve: --type-k/--type-v/--kv-unified go through serve() to the Engine; run: to the
    # Context. Given none, the library's default stands (no keyword is passed).
    import uvicorn

    import fastpar.server.service as service
    from fastpar.__main__ import main

    engines = []

    class FakeEngine:
        def __init__(self, model, **options):
            engines.append(options)
            raise RuntimeError("not started in this test")

    def started(self, *a, **k):
        with pytest.raises(RuntimeError, match="not started"):
            self.config.app.state.fastpar.loader()
        self.started = True

    monkeypatch.setattr(service, "Engine", FakeEngine)
    monkeypatch.setattr(fastpar, "Model", lambda *a, **k: None)
    monkeypatch.setattr(uvicorn.Server, "run", started)
    assert main(["serve", "--type-k", "q8_0", "--type-v", "q4_0", "--kv-unified"]) == 0
    assert main(["serve"]) == 0
    assert main(["serve", "--prefix-cache-mib", "0"]) == 0
    assert [(e.get("type_k"), e.get("type_v")) for e in engines] == [("q8_0", "q4_0"), (None, None), (None, None)]
    assert [e.get("kv_unified") for e in engines] == [True, None, None]
    # The server keeps a prefix cache unless told not to (docs/server.md); run and the
    # library do not (below).
    assert [e.get("prefix_cache_mib") for e in engines] == [-1, -1, 0]

    contexts = []

    def context(model, **options):
        contexts.append(options)
        raise fastpar.FastparError("not started in this test")

    monkeypatch.setattr(fastpar, "Context", context)
    src = tmp_path / "in.jsonl"
    src.write_text("")
    assert main(["run", str(src), "-o", str(tmp_path / "out.jsonl"), "--model", str(src), "--type-k", "q8_0"]) == 1
    assert contexts[0]["type_k"] == "q8_0" and "type_v" not in contexts[0] and "kv_unified" not in contexts[0]
    assert main(["run", str(src), "-o", str(tmp_path / "out.jsonl"), "--model", str(src), "--kv-unified"]) == 1
    assert contexts[1]["kv_unified"] is True
    assert "prefix_cache_mib" not in contexts[0]
