"""KV-cache types (Context's type_k and type_v): f16 is the default and changes nothing;
q8_0 and q4_0 contexts generate and score close to it; a bad name is a ValueError naming
the option, before any model work."""

from __future__ import annotations

import pytest

import fastpar
from conftest import GREEDY, ON_GPU, assert_clean, assert_same_greedy

PROMPTS = ["The capital of France is", "List three colours of the rainbow:", "def fibonacci(n):"]

# Plain English prose written for this test, 631 tokens with the default model: perplexity
# at n_ctx 128 scores 4 chunks of 63 tokens (252 tokens).
TEXT = (
    "The river that runs through the old town was once the reason the town existed at all. "
    "Boats carried grain, timber and wool down to the coast, and the merchants who owned them built "
    "tall stone houses along the water, each with a door that opened straight onto a narrow quay. "
    "When the railway arrived in the middle of the nineteenth century, the boats lost their trade "
    "within a few years. The warehouses stood empty, the quays crumbled, and the families who could "
    "afford to leave moved to the new streets near the station, where the air was cleaner and the "
    "houses had gardens. For almost a hundred years the riverside was a place people passed through "
    "quickly, if they went there at all.\n\n"
    "Things began to change after the war. A school teacher named Margaret Hale started taking her "
    "pupils to the river every spring to count the birds, and she wrote down what they saw in a "
    "series of notebooks that are now kept in the town library. Her records show herons, kingfishers "
    "and, in one unusually warm year, a pair of otters that raised their young under the roots of a "
    "willow near the old mill. The notebooks were read by a journalist, who wrote a short article "
    "about them for a regional newspaper, and the article was read in turn by a council officer who "
    "had been looking for a reason to clean up the banks.\n\n"
    "The work took more than twenty years. Volunteers cleared rubbish from the water, replanted the "
    "banks with reeds and alder, and rebuilt a footpath that had been washed away by floods. The "
    "council bought two of the empty warehouses and turned one into a small museum about the boats "
    "and the other into workshops for local craftspeople. A bakery opened in the ground floor of a "
    "merchant's house, then a bookshop, then a cafe with tables on the quay. By the end of the "
    "century the riverside had become the part of town that visitors were most likely to remember.\n\n"
    "Not everyone welcomed the change. Some of the older residents complained that the new shops "
    "were too expensive and that the footpath was crowded at weekends. Others worried that the "
    "birds Margaret Hale had counted would be driven away by the noise. The council responded by "
    "closing a stretch of the bank to the public during the nesting season and by asking the cafe "
    "to keep its music indoors. Surveys carried out since then suggest that the number of birds has "
    "stayed roughly the same, although the otters have not been seen for many years.\n\n"
    "Today the river is clean enough for children to paddle in during the summer, and the school "
    "still sends its pupils to count the birds each spring. Their results are posted on a board "
    "outside the museum, next to a photograph of Margaret Hale standing on the quay with a notebook "
    "in her hand. Most people who stop to read the board do not know who she was, but the town "
    "would look very different without her. The lesson that the town likes to draw from her story "
    "is a simple one: that careful attention, kept up patiently over many years, can change what a "
    "place becomes, even when the people paying attention have no power of their own."
)


N_CTX = 128


@pytest.fixture(scope="module")
def ppl(model):
    """The text's perplexity with each type for K and V (one context each, freed after)."""
    cache: dict = {}

    def run(kv_type: str) -> float:
        if kv_type not in cache:
            ctx = fastpar.Context(model, n_parallel=4, n_ctx_per_seq=N_CTX, type_k=kv_type, type_v=kv_type)
            cache[kv_type] = fastpar.perplexity(ctx, TEXT, n_ctx=N_CTX).perplexity
        return cache[kv_type]

    return run


def test_f16_is_the_default_and_changes_nothing(model):
    assert fastpar._core.ContextParams().type_k == fastpar._core.ContextParams().type_v == "f16"
    plain = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=256)
    f16 = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=256, type_k="f16", type_v="f16")
    assert (plain.type_k, plain.type_v) == ("f16", "f16")
    a = fastpar.generate_parallel(plain, PROMPTS[:2], max_tokens=16, temperature=0.0, logprobs=True)
    b = fastpar.generate_parallel(f16, PROMPTS[:2], max_tokens=16, temperature=0.0, logprobs=True)
    for x, y in zip(a, b):  # the same settings: bit-identical on the CPU (on a GPU: as GREEDY says)
        assert_same_greedy(x, y, "the default cache and type_k=type_v='f16'")
        if not ON_GPU:
            assert x.logprobs == y.logprobs


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
def test_quantized_caches_generate_sane_text(model, kv_type):
    ctx = fastpar.Context(model, n_parallel=3, n_ctx_per_seq=256, type_k=kv_type, type_v=kv_type)
    assert (ctx.type_k, ctx.type_v) == (kv_type, kv_type)
    out = fastpar.generate_parallel(ctx, PROMPTS, max_tokens=24, temperature=0.0)
    for c in out:
        assert c.finish_reason in ("stop", "length") and c.error is None
        assert c.n_gen_tokens > 0 and c.text.strip()
    assert "Paris" in out[0].text, out[0].text
    assert_clean(ctx)  # the cleanup contract holds for every type


def test_quantized_keys_alone_and_values_alone(model):
    # K may be quantized without flash attention; a quantized V turns it on (llama.cpp's auto).
    for k, v in (("q8_0", "f16"), ("f16", "q8_0"), ("bf16", "f32")):
        ctx = fastpar.Context(model, n_parallel=1, n_ctx_per_seq=128, type_k=k, type_v=v)
        (c,) = fastpar.generate_parallel(ctx, PROMPTS[:1], max_tokens=8, temperature=0.0)
        assert c.finish_reason in ("stop", "length") and c.n_gen_tokens > 0, (k, v, c.error)


def test_quantized_batched_equals_alone(model):
    # The batch-invariance of the default cache holds for q8_0 too (on a GPU: as GREEDY says).
    ctx = fastpar.Context(model, n_parallel=3, n_ctx_per_seq=256, type_k="q8_0", type_v="q8_0")
    alone = fastpar.Context(model, n_parallel=1, n_ctx_per_seq=256, type_k="q8_0", type_v="q8_0")
    batched = fastpar.generate_parallel(ctx, PROMPTS, max_tokens=16, **GREEDY)
    for c, prompt in zip(batched, PROMPTS):
        (want,) = fastpar.generate_parallel(alone, [prompt], max_tokens=16, **GREEDY)
        assert_same_greedy(c, want, f"{prompt!r} with a q8_0 cache, in a batch and alone")


def test_perplexity_cost(ppl):
    # Measured on the CPU build with the default model (SmolLM2-135M Q4_1), 631 tokens:
    # an AVX2 CPU f16 25.292, q8_0 25.401 (+0.43 %), q4_0 26.403 (+4.4 %), bf16 25.412
    # (+0.48 %), f32 = f16; an AVX-512 one f16 25.461, q8_0 25.170 (-1.14 %), q4_0 26.882
    # (+5.6 %). A text this short moves by about 1 % with the kernels' rounding (q8_0's fall
    # is no gain), so the bounds are on the cost, a rise: the 1 % for q8_0, 10 % for
    # q4_0 (over its measured cost); any change in either direction stays within 3 % / 15 %.
    # On a GPU the kernels round differently again: the same relative bounds, not these numbers.
    f16, q8, q4 = ppl("f16"), ppl("q8_0"), ppl("q4_0")
    assert q8 / f16 - 1 < 0.01 and abs(q8 / f16 - 1) < 0.03, (f16, q8)
    assert q4 / f16 - 1 < 0.10 and abs(q4 / f16 - 1) < 0.15, (f16, q4)


@pytest.mark.parametrize("keyword", ["type_k", "type_v"])
@pytest.mark.parametrize("value", ["q3", "F16", "", "q4_k"])
def test_a_bad_type_names_the_option(model, keyword, value):
    with pytest.raises(ValueError, match=f'{keyword} must be one of "f16", "bf16", "f32", "q8_0", "q4_0", '
                                         f'got "{value}"'):
        fastpar.Context(model, **{keyword: value})
    with pytest.raises(ValueError, match=f"{keyword} must be one of"):
        fastpar.Engine(model, **{keyword: value})


def test_a_type_that_is_not_a_string_is_a_type_error(model):
    with pytest.raises(TypeError, match="type_k must be a str"):
        fastpar.Context(model, type_k=8)


def test_engine_takes_the_types(model):
    with fastpar.Engine(model, n_parallel=2, n_ctx_per_seq=128, type_k="q8_0", type_v="q8_0") as engine:
        c = engine.submit(PROMPTS[0], max_tokens=8, temperature=0.0).result()
        assert c.finish_reason in ("stop", "length") and c.n_gen_tokens > 0
