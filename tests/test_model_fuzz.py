"""Malformed model files: hundreds of mutants of the default model, each tried in a process
of its own, raise an error with a message or load and generate; none kills its process.

The mutants (tests/gguf_mutants.py) are the default model cut to its first two layers (so a
mutant file is about 36 MB) with one defect each: every defect named below, neighbours of
them, random hyperparameters and tensor shapes, and byte-level damage (truncation, random
bytes, huge counts in the header, the metadata and the tensor infos). bench/fuzz_models.py
runs more of the random ones.
"""

from __future__ import annotations

import collections
import os
import random
import time

import pytest

import fastpar
import gguf_mutants as gm

SEED = 20240601
N_RANDOM_SEMANTIC = 40
N_BYTES = 100
TIMEOUT_S = 120.0   # per mutant; a load and four tokens take well under a second


@pytest.fixture(scope="module")
def base():
    return gm.Base.read(fastpar.default_model_path()).shrunk(2)


@pytest.fixture(scope="module")
def outcomes(base, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("mutants")
    mutants = gm.all_mutants(base, N_RANDOM_SEMANTIC, N_BYTES, SEED)
    start = time.monotonic()
    result = {o.mutant: o for o in gm.run_all(mutants, str(workdir), TIMEOUT_S, jobs=2)}
    counts = collections.Counter(o.verdict for o in result.values())
    print(f"\n{len(mutants)} mutants in {time.monotonic() - start:.0f} s: {dict(counts)}")
    assert len(result) == len(mutants), "two mutants share a name"
    assert os.listdir(workdir) == [], "a mutant file was left behind"
    return result


def test_no_mutant_kills_its_process_or_hangs(outcomes):
    assert len(outcomes) >= 200
    bad = [f"{o.mutant}: {o.verdict}: {o.detail}" for o in outcomes.values() if o.verdict not in ("raised", "loaded")]
    assert not bad, "\n".join(bad)
    counts = collections.Counter(o.verdict for o in outcomes.values())
    assert counts["raised"] > 0 and counts["loaded"] > 0


def test_errors_are_the_documented_ones(outcomes):
    for o in outcomes.values():
        if o.verdict == "raised":
            kind = o.detail.split()[1].rstrip(":")
            assert kind in ("ModelLoadError", "ValueError"), o
            assert len(o.detail) > len("raised ModelLoadError: ") + 10, o


# Values that made llama.cpp assert (killing the process) before fastpar checked them, and
# the words of the error that names them now.
ASSERTED = {
    "block_count=0": "block_count is 0",
    "block_count=100000": "block_count is 100000",
    "block_count=4294967295": "block_count is 4294967295",
    "rms_epsilon=-1e-05": "layer_norm_rms_epsilon is -0.0000",
    "rms_epsilon=nan": "layer_norm_rms_epsilon is nan",
    "head_count_kv=2, K/V shaped to match": "head_count_kv is 2",
    "head_count_kv=4": "head_count_kv is 4",
    "expert_count=2": "expert_count 2, expert_used_count 0",
    "expert_count=8,used=9": "more experts used per token than the model has",
    "rope.scaling.type=bogus": "rope.scaling.type is 'bogus'",
    "nextn_predict_layers=huge": "nextn_predict_layers is 1000",
    "type output_norm.weight=F16": "tensor 'output_norm.weight' has type f16",
    "type blk.0.attn_q.weight=I32": "tensor 'blk.0.attn_q.weight' has type i32",
    "tokens duplicate": "tokenizer.ggml.tokens lists the text",
    "tokenizer.model=none": "tokenizer.ggml.model is 'none'",
}


@pytest.mark.parametrize("name", sorted(ASSERTED))
def test_values_llama_cpp_asserts_on_raise_model_load_error_naming_them(outcomes, name):
    o = outcomes[name]
    assert o.verdict == "raised" and o.detail.startswith("raised ModelLoadError: "), o
    assert "is malformed: " in o.detail and ASSERTED[name] in o.detail, o


# The defects llama.cpp reports itself: the error carries its reason, not only the closing
# "failed to load model".
REPORTED = {
    "head_count=0": "wrong shape",
    "head_count_kv=9": "wrong shape",
    "embedding_length=577": "wrong shape",
    "shape token_embd.weight=[576, 49151]": "wrong shape",
    "missing tensor blk.0.attn_q.weight": "not found",
    "missing key llama.block_count": "key not found",
    "architecture='no-such-arch'": "unknown model architecture",
    "type token_embd.weight=200": "invalid ggml type",
    "tokens empty": "'token_embd.weight' has wrong shape; expected    576,      0",
    "tokens 100": "'token_embd.weight' has wrong shape; expected    576,    100",
}


@pytest.mark.parametrize("name", sorted(REPORTED))
def test_defects_llama_cpp_reports_raise_with_its_reason(outcomes, name):
    o = outcomes[name]
    assert o.verdict == "raised" and o.detail.startswith("raised ModelLoadError: "), o
    assert REPORTED[name] in o.detail, o


def test_out_of_range_special_tokens_and_context_length_still_generate(outcomes):
    for name in ["bos_token_id=4294967295", "eos_token_id=49152", "context_length=0", "merges empty"]:
        assert outcomes[name].verdict == "loaded", outcomes[name]


def test_chat_template_that_does_not_apply_fails_only_its_prompt(outcomes):
    names = [n for n in outcomes if n.startswith("chat_template")]
    assert len(names) >= 10
    for name in names:
        o = outcomes[name]
        assert o.verdict == "loaded", o
        plain, chat = o.detail.split()[1:]
        assert plain in ("stop", "length"), o
        assert chat in ("stop", "length", "error"), o
    assert outcomes["chat_template='{% for m in messages %}'"].detail.split()[2] == "error"


def test_harness_reports_an_abort_and_a_hang(tmp_path):
    # The fuzz test can fail: a child that aborts or hangs is reported as such.
    def nothing(path: str) -> None:
        open(path, "wb").close()

    probes = [gm.Mutant("abort", nothing, probe="abort"), gm.Mutant("hang", nothing, probe="hang")]
    got = {o.mutant: o.verdict for o in gm.run_all(probes, str(tmp_path), timeout=3.0, jobs=2)}
    assert got == {"abort": "crashed", "hang": "hung"}


def test_mutants_are_seeded(base):
    def names(seed):
        rng = random.Random(seed)
        return [m.name for m in gm.random_semantic_mutants(base, 20, rng) + gm.byte_mutants(base, 20, rng)]

    assert names(SEED) == names(SEED)
    assert names(SEED) != names(SEED + 1)
