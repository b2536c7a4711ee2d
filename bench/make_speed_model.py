#!/usr/bin/env python3
"""Build a shape-faithful synthetic speed model (docs/design.md, "Speed models").

Qwen3-0.6B's shape (28 layers, hidden 1024, 16 heads, 8 KV heads, head dim 128, FFN 3072,
tied embeddings) with random weights and the real Qwen2 tokenizer taken from the vendored
``vendor/llama.cpp/models/ggml-vocab-qwen2.gguf``, written as F16 with the ``gguf``
package, then quantized by ``llama-quantize`` built from the vendored source. Same shapes,
same cost per token as the real model; the text is noise, so benchmarks set ignore_eos.

    python bench/make_speed_model.py --quantize-bin PATH/llama-quantize [--type Q4_K_M]

Prints the path of the model; files are cached in $FASTPAR_CACHE/speed-models (default
~/.cache/fastpar/speed-models) and never committed.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys

import numpy as np

from fastpar._fetch import cache_dir

ROOT = pathlib.Path(__file__).resolve().parent.parent
VOCAB = ROOT / "vendor" / "llama.cpp" / "models" / "ggml-vocab-qwen2.gguf"

# Qwen3-0.6B (config.json of the released model).
SHAPE = dict(n_layer=28, n_embd=1024, n_head=16, n_head_kv=8, head_dim=128, n_ff=3072,
             n_ctx_train=40960, rope_theta=1_000_000.0, rms_eps=1e-6)
SEED = 0  # the same weights on every machine


def write_f16(path: pathlib.Path) -> None:
    import gguf

    vocab = gguf.GGUFReader(str(VOCAB))
    tokens = vocab.fields["tokenizer.ggml.tokens"].contents()
    n_vocab = len(tokens)
    s = SHAPE
    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_name("fastpar synthetic Qwen3-0.6B shape (random weights)")
    writer.add_context_length(s["n_ctx_train"])
    writer.add_embedding_length(s["n_embd"])
    writer.add_block_count(s["n_layer"])
    writer.add_feed_forward_length(s["n_ff"])
    writer.add_head_count(s["n_head"])
    writer.add_head_count_kv(s["n_head_kv"])
    writer.add_key_length(s["head_dim"])
    writer.add_value_length(s["head_dim"])
    writer.add_rope_freq_base(s["rope_theta"])
    writer.add_layer_norm_rms_eps(s["rms_eps"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    # The tokenizer, verbatim from the vendored vocabulary file.
    writer.add_tokenizer_model(vocab.fields["tokenizer.ggml.model"].contents())
    writer.add_tokenizer_pre(vocab.fields["tokenizer.ggml.pre"].contents())
    writer.add_token_list(tokens)
    writer.add_token_types(vocab.fields["tokenizer.ggml.token_type"].contents())
    writer.add_token_merges(vocab.fields["tokenizer.ggml.merges"].contents())
    writer.add_eos_token_id(vocab.fields["tokenizer.ggml.eos_token_id"].contents())
    writer.add_bos_token_id(vocab.fields["tokenizer.ggml.bos_token_id"].contents())
    writer.add_pad_token_id(vocab.fields["tokenizer.ggml.padding_token_id"].contents())
    writer.add_chat_template(vocab.fields["tokenizer.chat_template"].contents())

    rng = np.random.default_rng(SEED)

    def w(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    e, hd, ff = s["n_embd"], s["head_dim"], s["n_ff"]
    q_dim, kv_dim = s["n_head"] * hd, s["n_head_kv"] * hd
    writer.add_tensor("token_embd.weight", w(n_vocab, e))
    writer.add_tensor("output_norm.weight", ones(e))
    add_blocks(writer, s["n_layer"], e, q_dim, kv_dim, ff, w, ones, qk_norm=hd)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def add_blocks(writer, n_layer: int, e: int, q_dim: int, kv_dim: int, ff: int, w, ones, qk_norm: int = 0) -> None:
    """Each block's tensors, llama.cpp's names: attention, its norms, a gated FFN. `w(*shape)`
    and `ones(n)` make the weights; qk_norm: the head size of Qwen3's q and k norms (0: none)."""
    for i in range(n_layer):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", ones(e))
        writer.add_tensor(p + "attn_q.weight", w(q_dim, e))
        writer.add_tensor(p + "attn_k.weight", w(kv_dim, e))
        writer.add_tensor(p + "attn_v.weight", w(kv_dim, e))
        writer.add_tensor(p + "attn_output.weight", w(e, q_dim))
        if qk_norm:
            writer.add_tensor(p + "attn_q_norm.weight", ones(qk_norm))
            writer.add_tensor(p + "attn_k_norm.weight", ones(qk_norm))
        writer.add_tensor(p + "ffn_norm.weight", ones(e))
        writer.add_tensor(p + "ffn_gate.weight", w(ff, e))
        writer.add_tensor(p + "ffn_up.weight", w(ff, e))
        writer.add_tensor(p + "ffn_down.weight", w(e, ff))


def build(quantize_bin: str, qtype: str) -> pathlib.Path:
    out_dir = cache_dir() / "speed-models"
    out_dir.mkdir(parents=True, exist_ok=True)
    f16 = out_dir / "qwen3-0.6b-shape-F16.gguf"
    target = out_dir / f"qwen3-0.6b-shape-{qtype}.gguf"
    if target.is_file():
        return target
    if not f16.is_file():
        partial = f16.with_suffix(".partial")
        write_f16(partial)
        partial.rename(f16)
    if qtype == "F16":
        return f16
    partial = target.with_suffix(".partial")
    proc = subprocess.run([quantize_bin, str(f16), str(partial), qtype], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-quantize failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    partial.rename(target)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quantize-bin", required=False, default="llama-quantize",
                        help="llama-quantize built from vendor/llama.cpp")
    parser.add_argument("--type", default="Q4_K_M", help="F16 or a llama-quantize type (default Q4_K_M)")
    args = parser.parse_args()
    if not VOCAB.is_file():
        sys.exit(f"{VOCAB} is missing: run scripts/vendor_llama.py first")
    print(build(args.quantize_bin, args.type))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
