"""Small encoder models for the embedding tests, made at test time with the ``gguf`` package.

A BERT-kind model (llama.cpp's ``bert`` architecture, the bge/e5/MiniLM/gte kind) with random
weights and the real vocabulary of llama.cpp's vendored ``ggml-vocab-bert-bge.gguf``
(30,522 WordPiece tokens, its special-token ids and token types), or a reranker of the same
kind (bge-reranker's head: "rank" pooling over the first token, then a tanh layer and one
output, llama.cpp's cls and cls.output tensors), or a ``nomic-bert`` model (nomic-embed's
kind: one fused query-key-value matrix, rotary positions instead of learned ones, a gated
SiLU feed-forward, no biases but the norms'), with the same vocabulary. Its shape is small
(a few layers of width 64) so that tests stay fast; `bench/` makes bge-small's shape with
the same function. No weights are committed: the same seed gives the same file.
"""

from __future__ import annotations

import pathlib

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
BERT_VOCAB = ROOT / "vendor" / "llama.cpp" / "models" / "ggml-vocab-bert-bge.gguf"

# gguf's pooling type numbers (llama.h's llama_pooling_type).
POOLING = {"mean": 1, "cls": 2, "last": 3, "rank": 4}


def make_bert(path: pathlib.Path, *, n_layer: int = 2, n_embd: int = 64, n_head: int = 4, n_ff: int = 128,
              n_ctx_train: int = 512, pooling: str = "cls", rerank_template: str = "",
              arch: str = "bert", seed: int = 0) -> pathlib.Path:
    """Writes a BERT-kind embedding model to `path` (F32 weights) and returns it; with
    pooling "rank", a reranker (with `rerank_template`, the GGUF's
    tokenizer.chat_template.rerank, which llama-server fills with {query} and {document});
    with arch "nomic-bert", nomic-embed's kind (its converter's rope base, 1,000)."""
    import gguf

    if arch not in ("bert", "nomic-bert") or (arch != "bert" and pooling == "rank"):
        raise ValueError(f"no {arch} model with {pooling} pooling here")
    nomic = arch == "nomic-bert"

    vocab = gguf.GGUFReader(str(BERT_VOCAB))
    tokens = vocab.fields["tokenizer.ggml.tokens"].contents()
    n_vocab = len(tokens)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"fastpar test {arch} {n_layer}x{n_embd} (random weights)")
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_layer_norm_eps(1e-12)
    if nomic:
        writer.add_rope_freq_base(1000.0)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType(POOLING[pooling]))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_token_type_count(2)
    writer.add_tokenizer_model(vocab.fields["tokenizer.ggml.model"].contents())
    writer.add_tokenizer_pre(vocab.fields["tokenizer.ggml.pre"].contents())
    writer.add_token_list(tokens)
    writer.add_token_types(vocab.fields["tokenizer.ggml.token_type"].contents())
    for key in ("unknown_token_id", "seperator_token_id", "padding_token_id", "cls_token_id", "mask_token_id"):
        writer.add_uint32("tokenizer.ggml." + key, int(vocab.fields["tokenizer.ggml." + key].contents()))

    rng = np.random.default_rng(seed)

    def w(*shape: int, scale: float = 0.08) -> np.ndarray:
        # numpy's (rows, columns) = ggml's {columns, rows}: a weight {n_in, n_out} is (n_out, n_in).
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(name: str) -> None:
        writer.add_tensor(name + ".weight", (1.0 + w(n_embd, scale=0.02)).astype(np.float32))
        writer.add_tensor(name + ".bias", w(n_embd, scale=0.02))

    writer.add_tensor("token_embd.weight", w(n_vocab, n_embd, scale=0.5))
    writer.add_tensor("token_types.weight", w(2, n_embd, scale=0.5))
    if not nomic:
        writer.add_tensor("position_embd.weight", w(n_ctx_train, n_embd, scale=0.5))
    norm("token_embd_norm")
    for i in range(n_layer):
        if nomic:
            writer.add_tensor(f"blk.{i}.attn_qkv.weight", w(3 * n_embd, n_embd))
            writer.add_tensor(f"blk.{i}.attn_output.weight", w(n_embd, n_embd))
        else:
            for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
                writer.add_tensor(f"blk.{i}.{part}.weight", w(n_embd, n_embd))
                writer.add_tensor(f"blk.{i}.{part}.bias", w(n_embd, scale=0.02))
        norm(f"blk.{i}.attn_output_norm")
        writer.add_tensor(f"blk.{i}.ffn_up.weight", w(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", w(n_embd, n_ff))
        if nomic:
            writer.add_tensor(f"blk.{i}.ffn_gate.weight", w(n_ff, n_embd))
        else:
            writer.add_tensor(f"blk.{i}.ffn_up.bias", w(n_ff, scale=0.02))
            writer.add_tensor(f"blk.{i}.ffn_down.bias", w(n_embd, scale=0.02))
        norm(f"blk.{i}.layer_output_norm")
    if pooling == "rank":
        writer.add_tensor("cls.weight", w(n_embd, n_embd))
        writer.add_tensor("cls.bias", w(n_embd, scale=0.02))
        writer.add_tensor("cls.output.weight", w(1, n_embd, scale=0.5))
        writer.add_tensor("cls.output.bias", w(1, scale=0.1))
        if rerank_template:
            writer.add_string("tokenizer.chat_template.rerank", rerank_template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
