"""fastpar as an lm-evaluation-harness backend: real tasks from local data
(tests/lm_eval_tasks), run end to end by lm_eval.simple_evaluate, give the scores that
fastpar.loglikelihood and fastpar.generate_parallel give directly."""

from __future__ import annotations

import json
import pathlib

import pytest

import fastpar

lm_eval = pytest.importorskip("lm_eval")
import fastpar.lm_eval as fastpar_lm_eval  # noqa: E402  (registers "fastpar")

TASKS = pathlib.Path(__file__).resolve().parent / "lm_eval_tasks"


def _docs(name: str) -> list:
    return [json.loads(line) for line in (TASKS / name).read_text().splitlines()]


@pytest.fixture(scope="module")
def results(model: fastpar.Model, monkeypatch_module):
    from lm_eval.tasks import TaskManager

    monkeypatch_module.chdir(TASKS.parent)  # the task YAMLs name their data files from here
    monkeypatch_module.setenv("HF_DATASETS_OFFLINE", "1")
    ctx = fastpar.Context(model, n_parallel=8, n_ctx_per_seq=512)
    lm = fastpar_lm_eval.FastparLM(ctx)
    out = lm_eval.simple_evaluate(model=lm, tasks=["fastpar_mc", "fastpar_gen"],
                                  task_manager=TaskManager(include_path=str(TASKS)), log_samples=True,
                                  bootstrap_iters=0)
    return ctx, out


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_registered_as_fastpar() -> None:
    from lm_eval.api.registry import get_model

    assert get_model("fastpar") is fastpar_lm_eval.FastparLM


def test_multiple_choice_task_scores_equal_direct_loglikelihood(results) -> None:
    ctx, out = results
    docs = _docs("mc.jsonl")
    pairs = [(f"Question: {d['question']}\nAnswer:", " " + c) for d in docs for c in d["choices"]]
    scores = fastpar.loglikelihood(ctx, pairs)
    correct = []
    for i, d in enumerate(docs):
        lls = [s.logprob for s in scores[4 * i:4 * i + 4]]
        correct.append(float(max(range(4), key=lambda j: lls[j]) == d["answer"]))
    got = out["results"]["fastpar_mc"]["acc,none"]
    assert got == pytest.approx(sum(correct) / len(correct))
    # Each logged request's answer is the direct score of its pair.
    direct = {p: s for p, s in zip(pairs, scores)}
    for sample in out["samples"]["fastpar_mc"]:
        for args, resp in zip(sample["arguments"], sample["resps"]):
            if isinstance(args, dict):  # how some lm-eval versions log a request's arguments
                args = (args["gen_args_0"]["arg_0"], args["gen_args_0"]["arg_1"])
            want = direct[tuple(args)]
            assert float(resp[0][0]) == pytest.approx(want.logprob, abs=1e-6)
            assert resp[0][1] in (str(want.is_greedy), want.is_greedy)


def test_generation_task_scores_equal_direct_generation(results) -> None:
    ctx, out = results
    docs = _docs("gen.jsonl")
    gen = fastpar.generate_parallel(ctx, [f"Question: {d['question']}\nAnswer:" for d in docs], max_tokens=12,
                                    temperature=0.0, stop=["\n", "."])

    def norm(s: str) -> str:
        return "".join(ch for ch in s.lower() if ch.isalnum() or ch.isspace()).strip()

    want = sum(norm(c.text) == norm(d["answer"]) for c, d in zip(gen, docs)) / len(docs)
    assert out["results"]["fastpar_gen"]["exact_match,none"] == pytest.approx(want)
    logged = {s["doc"]["question"]: s["resps"][0][0] for s in out["samples"]["fastpar_gen"]}
    for c, d in zip(gen, docs):
        assert logged[d["question"]] == c.text
