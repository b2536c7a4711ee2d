"""fastpar.rerank and POST /v1/rerank: relevance scores from a reranker (a BERT-kind model
with bge-reranker's head, made at test time), held against llama.cpp's own llama-server
/rerank on the same model, with and without the GGUF's rerank template."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

import fastpar
from conftest import MORE_PROMPTS, N_GPU_LAYERS, ON_GPU, assert_empty
from embedding_models import make_bert
from llama_tools import llama_server

# Scores against llama-server's on the same pairs, batched as it batches them.
TOL = 1e-4
# A pair scored in other batch shapes (alone, or beside other pairs): llama.cpp's flash
# attention sums a batch's keys in chunks by its length, so the vector rounds apart (an
# encoder's cosine 1 - 1e-7, test_embeddings.py) and the head carries that to the score.
# Measured: at most 3.3e-4 on scores of about -3 on the CPU; 3.4e-3 on an H200 and 6.3e-3 on
# scores of about -1 on an H100 (its kernels round more apart between shapes, and by machine:
# an earlier H100 run stayed within 5e-3; bench/results/gpu-h200-tests.txt, runs 16 and 17).
SHAPES_TOL = 1e-2 if ON_GPU else 1e-3

QUERY = "What do pandas eat?"
DOCS = ["The giant panda's diet is almost entirely bamboo.",
        "Paris is the capital of France.",
        "",
        "Pandas also eat small animals and carrion now and then, though rarely.",
        *[f"{p} ({i})" for i, p in enumerate(MORE_PROMPTS[:8])]]

# A template as a reranker's GGUF may carry one (Qwen3-Reranker's kind): special tokens
# written as text, then {query} and {document}.
TEMPLATE = "[CLS] query: {query} [SEP] document: {document} [SEP]"


@pytest.fixture(scope="module", params=["plain", "template"])
def reranker(request, tmp_path_factory) -> fastpar.Model:
    path = make_bert(tmp_path_factory.mktemp("rerank") / f"{request.param}.gguf", pooling="rank",
                     rerank_template=TEMPLATE if request.param == "template" else "")
    return fastpar.Model(str(path), n_gpu_layers=N_GPU_LAYERS)


def test_scores_equal_llama_server(reranker):
    ctx = fastpar.Context(reranker, n_parallel=4, embeddings=True)
    assert ctx.pooling == "rank" and ctx.embedding_size == 1  # the GGUF's pooling; one output
    ours = fastpar.rerank(ctx, QUERY, DOCS)
    assert ours.shape == (len(DOCS),) and ours.dtype == np.float32 and ours.errors == {}
    assert_empty(ctx)
    with llama_server(reranker.path, "--reranking", "-np", "4", "-c", "4096", "-t", str(ctx.n_threads),
                      "-ngl", str(N_GPU_LAYERS)) as url:
        theirs = httpx.post(url + "/rerank", json={"query": QUERY, "documents": DOCS}, timeout=60).json()
    by_index = {r["index"]: r["relevance_score"] for r in theirs["results"]}
    assert np.abs(ours - np.array([by_index[i] for i in range(len(DOCS))])).max() <= TOL, (ours, theirs)
    # The pairs are the ones llama-server scored: its token count is theirs.
    assert theirs["usage"]["prompt_tokens"] == sum(len(reranker.rerank_tokens(QUERY, d)) for d in DOCS)
    # Scores differ from pair to pair (a broken head would give one number for all).
    assert np.ptp(ours) > 1e-3


def test_several_queries_and_a_pair_too_long(reranker):
    ctx = fastpar.Context(reranker, n_parallel=4, embeddings=True)
    queries = [QUERY, "Where is Paris?", "bamboo"]
    long_doc = "bamboo " * 600  # more tokens than a batch (and the model's training context) holds
    docs = DOCS + [long_doc]
    matrix = fastpar.rerank(ctx, queries, docs)
    assert matrix.shape == (len(queries), len(docs))
    assert sorted(matrix.errors) == [(q, len(docs) - 1) for q in range(len(queries))]
    assert "tokens" in matrix.errors[(0, len(docs) - 1)] and np.isnan(matrix[:, -1]).all()
    for q, query in enumerate(queries):
        alone = fastpar.rerank(ctx, query, DOCS)
        assert np.abs(matrix[q, :-1] - alone).max() <= TOL
    one = np.array([fastpar.rerank(ctx, QUERY, [d])[0] for d in DOCS[:3]])
    assert np.abs(one - matrix[0, :3]).max() <= SHAPES_TOL  # alone, in other batch shapes
    assert fastpar.rerank(ctx, QUERY, []).shape == (0,)
    assert_empty(ctx)


def test_wrong_contexts_and_arguments(model, reranker):
    with pytest.raises(ValueError, match="made for generation"):
        fastpar.rerank(fastpar.Context(model, n_parallel=1), QUERY, DOCS)
    with pytest.raises(ValueError, match="pooling 'mean'"):
        fastpar.rerank(fastpar.Context(model, n_parallel=1, embeddings=True), QUERY, DOCS)
    ctx = fastpar.Context(reranker, n_parallel=2, embeddings=True)
    with pytest.raises(ValueError, match="use fastpar.rerank"):
        fastpar.embed(ctx, ["a text"])
    for query, docs, match in ((QUERY, "one document", "documents must be a list"),
                               (QUERY, ["a", 3], r"documents\[1\] must be a str"),
                               ([QUERY, None], DOCS, r"query\[1\] must be a str"), (3, DOCS, "query must be")):
        with pytest.raises(TypeError, match=match):
            fastpar.rerank(ctx, query, docs)
    # A model without a classification head cannot rank: llama.cpp would return a hidden
    # state's first value as every score.
    with pytest.raises(ValueError, match="no classification head"):
        fastpar.Context(model, n_parallel=1, embeddings=True, pooling="rank")


def test_v1_rerank_in_llama_servers_jinas_and_teis_shapes(reranker):
    from fastpar.server import create_app
    from test_server import running

    want = fastpar.rerank(fastpar.Context(reranker, n_parallel=4, embeddings=True), QUERY, DOCS)

    def check(results, label):  # most relevant first, every score fastpar.rerank's (other batch shapes)
        scores = [r[label] for r in results]
        assert scores == sorted(scores, reverse=True)
        assert np.abs(np.array(scores) - want[[r["index"] for r in results]]).max() <= SHAPES_TOL

    with fastpar.Engine(reranker, n_parallel=4, embeddings=True) as engine, running(create_app(engine)) as url:
        body = httpx.post(url + "/v1/rerank", json={"model": "m", "query": QUERY, "documents": DOCS}).json()
        assert body["object"] == "list" and body["model"] == "m"
        assert sorted(r["index"] for r in body["results"]) == list(range(len(DOCS)))
        check(body["results"], "relevance_score")
        assert body["usage"]["prompt_tokens"] == sum(len(reranker.rerank_tokens(QUERY, d)) for d in DOCS)
        top = httpx.post(url + "/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 2,
                                                "return_documents": True}).json()["results"]
        assert len(top) == 2 and all(r["document"]["text"] == DOCS[r["index"]] for r in top)
        assert top[0]["index"] == body["results"][0]["index"]
        check(top, "relevance_score")
        tei = httpx.post(url + "/reranking", json={"query": QUERY, "texts": DOCS, "return_text": True}).json()
        assert len(tei) == len(DOCS) and all(r["text"] == DOCS[r["index"]] for r in tei)
        check(tei, "score")
        # One pair too long fails alone, listed last; all failing is a 400.
        mixed = httpx.post(url + "/v1/rerank", json={"query": QUERY, "documents": [DOCS[0], "x " * 600]}).json()
        assert [r["index"] for r in mixed["results"]] == [0, 1] and mixed["results"][1]["relevance_score"] is None
        assert "tokens" in mixed["results"][1]["error"]["message"]
        for body, why in (({"query": QUERY, "documents": ["x " * 600]}, "document 0: text has"),
                          ({"query": QUERY, "documents": []}, "'documents' must be"),
                          ({"documents": DOCS}, "'query' must be"),
                          ({"query": QUERY, "documents": DOCS, "top_n": 0}, "'top_n'")):
            r = httpx.post(url + "/v1/rerank", json=body)
            assert r.status_code == 400 and why in r.json()["error"]["message"], (body, r.text)
        r = httpx.post(url + "/v1/embeddings", json={"input": "Hello"})
        assert r.status_code == 400 and "/v1/rerank" in r.json()["error"]["message"]
        r = httpx.post(url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 2})
        assert r.status_code == 400 and "reranks" in r.json()["error"]["message"]
        metrics = httpx.get(url + "/metrics").text
        assert 'fastpar_requests_total{endpoint="rerank",outcome="success"} 4.0' in metrics
        assert 'fastpar_requests_total{endpoint="rerank",outcome="bad_request"} 4.0' in metrics


def test_v1_rerank_on_an_embeddings_server_names_the_option(model):
    from fastpar.server import create_app
    from test_server import running

    with fastpar.Engine(model, n_parallel=1, embeddings=True) as engine, running(create_app(engine)) as url:
        r = httpx.post(url + "/v1/rerank", json={"query": QUERY, "documents": DOCS})
        assert r.status_code == 400 and "--rerank" in r.json()["error"]["message"]


def test_cleanup_after_many_pairs(reranker):
    ctx = fastpar.Context(reranker, n_parallel=8, embeddings=True)
    docs = [f"{p} ({i})" * (1 + i % 3) for i, p in enumerate(MORE_PROMPTS + MORE_PROMPTS)]
    first = fastpar.rerank(ctx, QUERY, docs)
    assert ctx.last_stats.n_decode_calls > 1 and ctx.last_stats.n_prompts == len(docs)
    assert_empty(ctx)
    assert np.array_equal(fastpar.rerank(ctx, QUERY, docs), first)  # repeatable, nothing left between calls


def test_serve_rerank_option():
    from fastpar.__main__ import _parse

    args = _parse(["serve", "--rerank"])
    assert (args.embeddings, args.pooling) == (True, "rank")
    assert _parse(["serve", "--reranking"]).pooling == "rank"
    with pytest.raises(SystemExit) as e:
        _parse(["serve", "--rerank", "--pooling", "mean"])
    assert e.value.code == 2
