"""Malformed variants ("mutants") of a GGUF model, for tests/test_model_fuzz.py and bench/fuzz_models.py.

The `gguf` package reads the model (GGUFReader); each mutant is the model with one defect,
written back as a GGUF file: byte-level mutants (truncations, random bytes, huge counts in
the header, the metadata and the tensor infos) and semantic ones (a file that parses but
whose hyperparameters, tensors, tokenizer or chat template lie). Tensor data is laid out as
GGUF requires (each tensor at the running, aligned offset its shape and type give), so a
semantic mutant reaches llama.cpp's model loader instead of stopping at the file format.

`Base.shrunk` drops all but a few layers, so that a mutant file is about a third of the
default model and a fuzz run writes and loads hundreds of them in minutes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import struct
import subprocess
import sys
from typing import Callable, Iterator

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType

ALIGNMENT = 32
T = GGUFValueType
_SCALAR = {T.UINT8: "<B", T.INT8: "<b", T.UINT16: "<H", T.INT16: "<h", T.UINT32: "<I", T.INT32: "<i",
           T.FLOAT32: "<f", T.UINT64: "<Q", T.INT64: "<q", T.FLOAT64: "<d", T.BOOL: "<?"}
HUGE = [2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**63 - 1, 2**64 - 1]


def pack_str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def pack_value(vtype: GGUFValueType, value, sub_type: GGUFValueType | None = None) -> bytes:
    """The bytes of one GGUF value: its type, then its payload."""
    out = struct.pack("<I", int(vtype))
    if vtype == T.STRING:
        return out + pack_str(value)
    if vtype == T.ARRAY:
        assert sub_type is not None
        out += struct.pack("<IQ", int(sub_type), len(value))
        if sub_type == T.STRING:
            return out + b"".join(pack_str(v) for v in value)
        return out + np.asarray(value, dtype=np.dtype(_SCALAR[sub_type])).tobytes()
    return out + struct.pack(_SCALAR[vtype], value)


def nbytes(dims: list[int], ggml_type: int) -> int:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    return math.prod(dims) // block * size


def _pad(n: int, align: int = ALIGNMENT) -> int:
    return (n + align - 1) // align * align


def _decode(vtype: GGUFValueType, raw: bytes, pos: int):
    """(value, position after it) of a value of type `vtype` at raw[pos:]."""
    if vtype == T.STRING:
        n = struct.unpack_from("<Q", raw, pos)[0]
        return bytes(raw[pos + 8:pos + 8 + n]).decode(errors="replace"), pos + 8 + n
    if vtype == T.ARRAY:
        sub, n = struct.unpack_from("<IQ", raw, pos)
        pos += 12
        if sub == T.STRING:
            values = []
            for _ in range(n):
                v, pos = _decode(T.STRING, raw, pos)
                values.append(v)
            return values, pos
        dt = np.dtype(_SCALAR[T(sub)])
        return np.frombuffer(raw, dt, n, pos).tolist(), pos + n * dt.itemsize
    return struct.unpack_from(_SCALAR[vtype], raw, pos)[0], pos + struct.calcsize(_SCALAR[vtype])


@dataclasses.dataclass
class Tensor:
    name: str
    dims: list[int]        # ggml order: ne0 first
    ggml_type: int
    data: bytes
    offset: int | None = None  # None: the running aligned offset, as GGUF requires


@dataclasses.dataclass
class Gguf:
    """A GGUF file as values that a mutation may change, and its serialisation."""

    kvs: list[tuple[str, bytes]]   # key, encoded value (type + payload)
    tensors: list[Tensor]
    version: int = 3
    n_tensors: int | None = None   # None: len(tensors)
    n_kv: int | None = None        # None: len(kvs)
    magic: bytes = b"GGUF"

    def copy(self) -> "Gguf":
        return dataclasses.replace(self, kvs=list(self.kvs), tensors=[dataclasses.replace(t) for t in self.tensors])

    def index(self, key: str) -> int:
        return next(i for i, (k, _) in enumerate(self.kvs) if k == key)

    def has(self, key: str) -> bool:
        return any(k == key for k, _ in self.kvs)

    def set(self, key: str, vtype: GGUFValueType, value, sub_type: GGUFValueType | None = None) -> None:
        raw = pack_value(vtype, value, sub_type)
        if self.has(key):
            self.kvs[self.index(key)] = (key, raw)
        else:
            self.kvs.append((key, raw))

    def drop(self, key: str) -> None:
        self.kvs.pop(self.index(key))

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name)

    def reshape(self, name: str, dims: list[int], ggml_type: int | None = None) -> None:
        """New dims (and type) for a tensor, its data cut or zero-padded to the size they need."""
        t = self.tensor(name)
        t.dims = list(dims)
        if ggml_type is not None:
            t.ggml_type = ggml_type
        n = nbytes(t.dims, t.ggml_type)
        t.data = bytes(t.data[:n]) + bytes(max(0, n - len(t.data)))

    def header(self) -> bytes:
        """The bytes before the tensor data; sets `spots` to the (offset, width) of every count,
        length, type and dimension in them, the places where a huge number does the most harm."""
        out = bytearray(self.magic)
        out += struct.pack("<IQQ", self.version, len(self.tensors) if self.n_tensors is None else self.n_tensors,
                           len(self.kvs) if self.n_kv is None else self.n_kv)
        spots = [(4, 4), (8, 8), (16, 8)]
        for key, raw in self.kvs:
            spots += [(len(out), 8), (len(out) + 8 + len(key.encode()), 4)]
            vtype = struct.unpack_from("<I", raw)[0] if len(raw) >= 4 else None
            if vtype in (T.STRING, T.ARRAY):
                spots.append((spots[-1][0] + 4, 8 if vtype == T.STRING else 4))
            if vtype == T.ARRAY:
                spots.append((spots[-1][0] + 4, 8))
                if struct.unpack_from("<I", raw, 4)[0] == T.STRING and len(raw) >= 20:
                    spots.append((spots[-1][0] + 8, 8))   # the first string's length
            out += pack_str(key) + raw
        running = 0
        for t in self.tensors:
            spots.append((len(out), 8))
            out += pack_str(t.name)
            spots += [(len(out), 4)] + [(len(out) + 4 + 8 * j, 8) for j in range(len(t.dims))]
            out += struct.pack("<I", len(t.dims))
            out += b"".join(struct.pack("<Q", d) for d in t.dims)
            spots += [(len(out), 4), (len(out) + 4, 8)]
            out += struct.pack("<IQ", t.ggml_type, running if t.offset is None else t.offset)
            running += _pad(len(t.data))
        out += bytes(_pad(len(out)) - len(out))
        self.spots = spots
        return bytes(out)

    def get(self, key: str):
        """A scalar, string or array value of the file."""
        raw = self.kvs[self.index(key)][1]
        vtype = T(struct.unpack_from("<I", raw)[0])
        return _decode(vtype, raw, 4)[0]

    def write(self, path: str | os.PathLike) -> None:
        with open(path, "wb") as f:
            f.write(self.header())
            for t in self.tensors:
                f.write(t.data)
                f.write(bytes(_pad(len(t.data)) - len(t.data)))


class Base:
    """The model to mutate: its values, and its bytes as written."""

    def __init__(self, gguf: Gguf):
        self.gguf = gguf
        self.arch = gguf.get("general.architecture")
        self.data_offset = len(gguf.header())
        self.spots = gguf.spots
        chunks = [gguf.header()]
        for t in gguf.tensors:
            chunks += [t.data, bytes(_pad(len(t.data)) - len(t.data))]
        self.bytes = b"".join(chunks)

    @classmethod
    def read(cls, path: str | os.PathLike) -> "Base":
        r = GGUFReader(str(path))
        raw = np.asarray(r.data)
        kvs = []
        for name, f in r.fields.items():
            if name.startswith("GGUF."):
                continue
            start = f.offset + 8 + len(name.encode())
            end = f.offset + sum(int(p.nbytes) for p in f.parts)
            kvs.append((name, raw[start:end].tobytes()))
        tensors = [Tensor(t.name, [int(d) for d in t.field.parts[3]], int(t.field.parts[4][0]),
                          raw[t.data_offset:t.data_offset + int(t.n_bytes)].tobytes()) for t in r.tensors]
        return cls(Gguf(kvs, tensors, version=int(r.fields["GGUF.version"].parts[0][0])))

    def value(self, key: str):
        return self.gguf.get(key)

    def key(self, suffix: str) -> str:
        return f"{self.arch}.{suffix}"

    def shrunk(self, n_layers: int) -> "Base":
        """The model with only its first `n_layers` layers (a smaller valid model)."""
        g = self.gguf.copy()
        g.tensors = [t for t in g.tensors if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < n_layers]
        g.set(self.key("block_count"), T.UINT32, n_layers)
        return Base(g)

    def write(self, path: str | os.PathLike) -> None:
        with open(path, "wb") as f:
            f.write(self.bytes)


@dataclasses.dataclass
class Mutant:
    name: str
    write: Callable[[str], None]   # writes the mutant to the path it is given
    chat: bool = True              # also try a chat prompt at generation
    probe: str = ""                # "abort" or "hang": the child does that instead (the harness's own test)


def _edit(base: Base, change: Callable[[Gguf], None]) -> Callable[[str], None]:
    def write(path: str) -> None:
        g = base.gguf.copy()
        change(g)
        g.write(path)
    return write


def _patched(base: Base, patches: list[tuple[int, bytes]], truncate: int | None = None) -> Callable[[str], None]:
    def write(path: str) -> None:
        head = bytearray(base.bytes[:base.data_offset])
        tail = memoryview(base.bytes)[base.data_offset:]
        for off, b in patches:
            head[off:off + len(b)] = b
        with open(path, "wb") as f:
            if truncate is not None:
                f.write((bytes(head) + bytes(tail))[:truncate] if truncate > len(head) else head[:truncate])
            else:
                f.write(head)
                f.write(tail)
    return write


def semantic_mutants(base: Base) -> list[Mutant]:
    """One mutant per defect named in the fuzz contract, and its neighbours."""
    g0 = base.gguf
    k = base.key
    out: list[Mutant] = []

    def add(name: str, change: Callable[[Gguf], None], chat: bool = True) -> None:
        out.append(Mutant(name, _edit(base, change), chat))

    def set_u32(key: str, v: int) -> Callable[[Gguf], None]:
        return lambda g: g.set(key, T.UINT32, v)

    def set_f32(key: str, v: float) -> Callable[[Gguf], None]:
        return lambda g: g.set(key, T.FLOAT32, v)

    n_layer = base.value(k("block_count"))
    n_head = base.value(k("attention.head_count"))
    n_embd = base.value(k("embedding_length"))
    emb = g0.tensor("token_embd.weight")
    n_vocab = emb.dims[1]

    for v in [0, 1, n_layer + 1, 512, 513, 100000] + HUGE[:3]:
        add(f"block_count={v}", set_u32(k("block_count"), v))
    for v in [0, n_head - 2, n_head + 1, n_embd, n_embd + 1] + HUGE[:3]:
        add(f"head_count={v}", set_u32(k("attention.head_count"), v))
    for v in [0, 2, 4, n_head, n_head + 1, 2 * n_head] + HUGE[:3]:
        add(f"head_count_kv={v}", set_u32(k("attention.head_count_kv"), v))
    for v in [0, 1, n_embd - 1, n_embd + 1, n_embd + n_head] + HUGE[:3]:
        add(f"embedding_length={v}", set_u32(k("embedding_length"), v))
    for v in [0, 1, 1537] + HUGE[:3]:
        add(f"feed_forward_length={v}", set_u32(k("feed_forward_length"), v))
    for v in [0, 1, 4] + HUGE[:3]:
        add(f"context_length={v}", set_u32(k("context_length"), v))
    for v in [-1e-5, -1.0, float("nan"), float("inf"), float("-inf"), 0.0, 1e30]:
        add(f"rms_epsilon={v}", set_f32(k("attention.layer_norm_rms_epsilon"), v))
    for v in [-1e-5, float("nan")]:
        add(f"layer_norm_epsilon={v}", set_f32(k("attention.layer_norm_epsilon"), v))
    for v in [0.0, -1.0, float("nan"), float("inf")]:
        add(f"rope.freq_base={v}", set_f32(k("rope.freq_base"), v))
    for v in [0, 1, 63, 65] + HUGE[:3]:
        add(f"rope.dimension_count={v}", set_u32(k("rope.dimension_count"), v))
    for v in [0, n_vocab + 1]:
        add(f"vocab_size={v}", set_u32(k("vocab_size"), v))
    for v in [0, 1, 2, 3, 4, 8]:
        add(f"expert_count={v}", set_u32(k("expert_count"), v))
        add(f"expert_used_count={v}", set_u32(k("expert_used_count"), v))
    add("expert_count=8,used=9", lambda g: (g.set(k("expert_count"), T.UINT32, 8),
                                            g.set(k("expert_used_count"), T.UINT32, 9)))
    add("expert groups without experts", set_u32(k("expert_group_count"), 2))
    add("expert groups=experts", lambda g: (g.set(k("expert_count"), T.UINT32, 4), g.set(k("expert_used_count"), T.UINT32, 2),
                                            g.set(k("expert_group_count"), T.UINT32, 4)))
    add("expert_used_count:array-zero", lambda g: (g.set(k("expert_count"), T.UINT32, 4),
                                                   g.set(k("expert_used_count"), T.ARRAY, [0] * n_layer, T.UINT32)))
    add("rope.scaling.type=bogus", lambda g: g.set(k("rope.scaling.type"), T.STRING, "bogus"))
    add("rope.scaling.factor=-1", set_f32(k("rope.scaling.factor"), -1.0))
    add("attention.key_length=0", set_u32(k("attention.key_length"), 0))
    add("attention.key_length=huge", set_u32(k("attention.key_length"), 2**32 - 1))
    add("attention.value_length=0", set_u32(k("attention.value_length"), 0))
    add("nextn_predict_layers=huge", set_u32(k("nextn_predict_layers"), 1000))

    # Hyperparameters of another type or shape than llama.cpp expects.
    add("block_count:string", lambda g: g.set(k("block_count"), T.STRING, str(n_layer)))
    add("block_count:float", lambda g: g.set(k("block_count"), T.FLOAT32, float(n_layer)))
    add("block_count:int32=-1", lambda g: g.set(k("block_count"), T.INT32, -1))
    add("block_count:uint64", lambda g: g.set(k("block_count"), T.UINT64, 2**40))
    add("block_count:array", lambda g: g.set(k("block_count"), T.ARRAY, [n_layer], T.UINT32))
    add("head_count:array-zeros", lambda g: g.set(k("attention.head_count"), T.ARRAY, [0] * n_layer, T.UINT32))
    add("head_count:array-short", lambda g: g.set(k("attention.head_count"), T.ARRAY, [n_head], T.UINT32))
    add("head_count_kv:array-zero", lambda g: g.set(k("attention.head_count_kv"), T.ARRAY,
                                                    [0] + [3] * (n_layer - 1), T.UINT32))
    add("head_count_kv:array-nondividing", lambda g: g.set(k("attention.head_count_kv"), T.ARRAY,
                                                           [2] * n_layer, T.UINT32))
    head_dim = n_embd // n_head
    for kv in [2, 4, 9]:   # K and V shaped to match, so only the head counts disagree
        add(f"head_count_kv={kv}, K/V shaped to match", lambda g, kv=kv: [
            g.reshape(f"blk.{i}.attn_{w}.weight", [n_embd, kv * head_dim])
            for i in range(n_layer) for w in "kv"] and g.set(k("attention.head_count_kv"), T.UINT32, kv))
    add("feed_forward_length:array-zero", lambda g: g.set(k("feed_forward_length"), T.ARRAY, [0] * n_layer, T.UINT32))
    add("rms_epsilon:string", lambda g: g.set(k("attention.layer_norm_rms_epsilon"), T.STRING, "1e-5"))
    add("rms_epsilon:float64", lambda g: g.set(k("attention.layer_norm_rms_epsilon"), T.FLOAT64, -1.0))
    add("architecture:uint32", lambda g: g.set("general.architecture", T.UINT32, 7))

    # Missing keys.
    for key in [k("block_count"), k("embedding_length"), k("attention.head_count"), k("attention.head_count_kv"),
                k("context_length"), k("feed_forward_length"), k("attention.layer_norm_rms_epsilon"),
                k("rope.dimension_count"), "general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.tokens",
                "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id",
                "tokenizer.chat_template"]:
        if g0.has(key):
            add(f"missing key {key}", lambda g, key=key: g.drop(key))

    # Architectures: unknown, and known ones whose keys and tensors this model lacks.
    for arch in ["no-such-arch", "", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "gpt2", "falcon",
                 "mamba", "rwkv6", "bert", "t5", "deepseek2", "qwen3moe", "llama4", "starcoder2", "olmo2",
                 "clip", "wavtokenizer-dec"]:
        def rename(g: Gguf, arch=arch) -> None:
            g.kvs = [((arch + key[len(base.arch):]) if key.startswith(base.arch + ".") else key, raw)
                     for key, raw in g.kvs]
            g.set("general.architecture", T.STRING, arch)
        add(f"architecture={arch!r}", rename)

    # Tensors: missing, extra, duplicated, of the wrong shape, type or place.
    for name in ["token_embd.weight", "output_norm.weight", "blk.0.attn_q.weight", "blk.0.attn_norm.weight",
                 f"blk.{n_layer - 1}.ffn_down.weight"]:
        add(f"missing tensor {name}", lambda g, name=name: g.tensors.remove(g.tensor(name)))
    add("extra tensor blk.99", lambda g: g.tensors.append(dataclasses.replace(g.tensor("blk.0.attn_q.weight"),
                                                                              name="blk.99.attn_q.weight")))
    add("extra tensor unknown", lambda g: g.tensors.append(Tensor("nonsense.weight", [32], 0, bytes(128))))
    add("duplicate tensor", lambda g: g.tensors.append(dataclasses.replace(g.tensor("output_norm.weight"))))
    add("duplicate key", lambda g: g.kvs.append(g.kvs[g.index(k("block_count"))]))
    for name, dims in [("token_embd.weight", [n_embd, n_vocab - 1]), ("token_embd.weight", [n_embd, n_vocab + 1]),
                       ("token_embd.weight", [n_embd + 32, n_vocab]), ("token_embd.weight", [n_embd, 1]),
                       ("token_embd.weight", [n_embd, n_vocab, 1, 1]),
                       ("blk.0.attn_q.weight", [n_embd, n_embd + 32]), ("blk.0.attn_k.weight", [n_embd, 64]),
                       ("blk.0.attn_norm.weight", [n_embd + 1]), ("output_norm.weight", [1]),
                       ("blk.0.ffn_down.weight", [1536, n_embd + 32]), ("blk.0.ffn_up.weight", [n_embd, 64]),
                       ("output_norm.weight", [n_embd, 2])]:
        add(f"shape {name}={dims}", lambda g, name=name, dims=dims: g.reshape(name, dims))
    for name, t in [("token_embd.weight", GGMLQuantizationType.F32), ("blk.0.attn_q.weight", GGMLQuantizationType.Q8_0),
                    ("output_norm.weight", GGMLQuantizationType.F16), ("blk.0.attn_q.weight", GGMLQuantizationType.I32),
                    ("output_norm.weight", GGMLQuantizationType.I8)]:
        add(f"type {name}={t.name}", lambda g, name=name, t=t: g.reshape(name, g.tensor(name).dims, int(t)))
    for v in [4, 5, 39, 200, 2**31]:   # 4 and 5 are removed types; the others never existed
        add(f"type token_embd.weight={v}", lambda g, v=v: setattr(g.tensor("token_embd.weight"), "ggml_type", v))
    add("tensor offset misaligned", lambda g: setattr(g.tensors[1], "offset", 1))
    add("tensor offset huge", lambda g: setattr(g.tensors[-1], "offset", 2**62))
    add("tensor n_dims=0", lambda g: setattr(g.tensor("output_norm.weight"), "dims", []))
    add("tensor n_dims=5", lambda g: setattr(g.tensor("output_norm.weight"), "dims", [n_embd, 1, 1, 1, 1]))
    add("tensor dim=0", lambda g: g.reshape("output_norm.weight", [0]))
    add("no tensors", lambda g: setattr(g, "tensors", []))

    # Tokenizer.
    tokens = base.value("tokenizer.ggml.tokens")
    add("tokens empty", lambda g: g.set("tokenizer.ggml.tokens", T.ARRAY, [], T.STRING))
    add("tokens 100", lambda g: g.set("tokenizer.ggml.tokens", T.ARRAY, tokens[:100], T.STRING))
    add("tokens 1", lambda g: g.set("tokenizer.ggml.tokens", T.ARRAY, tokens[:1], T.STRING))
    add("tokens +1", lambda g: g.set("tokenizer.ggml.tokens", T.ARRAY, tokens + ["<extra>"], T.STRING))
    add("tokens duplicate", lambda g: g.set("tokenizer.ggml.tokens", T.ARRAY, tokens[:11] + tokens[10:-1], T.STRING))
    add("tokens all empty strings", lambda g: g.set("tokenizer.ggml.tokens", T.ARRAY, [""] * len(tokens), T.STRING))
    add("tokens:uint32", lambda g: g.set("tokenizer.ggml.tokens", T.ARRAY, list(range(len(tokens))), T.UINT32))
    add("token_type short", lambda g: g.set("tokenizer.ggml.token_type", T.ARRAY, [1] * 10, T.INT32))
    add("token_type:float", lambda g: g.set("tokenizer.ggml.token_type", T.ARRAY, [1.0] * len(tokens), T.FLOAT32))
    add("token_type:string", lambda g: g.set("tokenizer.ggml.token_type", T.ARRAY, ["x"] * len(tokens), T.STRING))
    add("token_type all control", lambda g: g.set("tokenizer.ggml.token_type", T.ARRAY, [3] * len(tokens), T.INT32))
    add("token_type huge values", lambda g: g.set("tokenizer.ggml.token_type", T.ARRAY, [2**30] * len(tokens), T.INT32))
    add("scores short", lambda g: g.set("tokenizer.ggml.scores", T.ARRAY, [0.0] * 10, T.FLOAT32))
    add("scores:string", lambda g: g.set("tokenizer.ggml.scores", T.ARRAY, ["x"] * len(tokens), T.STRING))
    add("merges empty", lambda g: g.set("tokenizer.ggml.merges", T.ARRAY, [], T.STRING))
    add("merges garbage", lambda g: g.set("tokenizer.ggml.merges", T.ARRAY, ["a", " ", "a b c", "zz qq"], T.STRING))
    add("merges:uint32", lambda g: g.set("tokenizer.ggml.merges", T.ARRAY, [1, 2, 3], T.UINT32))
    for model in ["foo", "llama", "bert", "t5", "rwkv", "ugm", "plamo2", "none", "no_vocab"]:
        add(f"tokenizer.model={model}", lambda g, model=model: g.set("tokenizer.ggml.model", T.STRING, model))
    add("tokenizer.pre=foo", lambda g: g.set("tokenizer.ggml.pre", T.STRING, "foo"))
    add("tokenizer.model:uint32", lambda g: g.set("tokenizer.ggml.model", T.UINT32, 1))
    for key in ["bos", "eos", "unknown", "padding", "eot", "eom", "sep", "cls", "mask", "fim_pre"]:
        for v in [len(tokens), len(tokens) + 1000, 2**31 - 1, 2**32 - 1]:
            add(f"{key}_token_id={v}", lambda g, key=key, v=v: g.set(f"tokenizer.ggml.{key}_token_id", T.UINT32, v))
    add("bos_token_id:int32=-5", lambda g: g.set("tokenizer.ggml.bos_token_id", T.INT32, -5))
    add("bos_token_id:string", lambda g: g.set("tokenizer.ggml.bos_token_id", T.STRING, "1"))
    add("add_bos:uint32", lambda g: g.set("tokenizer.ggml.add_bos_token", T.UINT32, 5))
    add("bos out of range, add_bos", lambda g: (g.set("tokenizer.ggml.bos_token_id", T.UINT32, len(tokens) + 7),
                                                g.set("tokenizer.ggml.add_bos_token", T.BOOL, True)))
    add("eos out of range, add_eos", lambda g: (g.set("tokenizer.ggml.eos_token_id", T.UINT32, len(tokens) + 7),
                                                g.set("tokenizer.ggml.add_eos_token", T.BOOL, True)))

    # Chat templates that do not parse, or do harm when applied.
    for tmpl in ["{% for m in messages %}", "{{ messages[0]['content'] ", "{% if %}{% endif %}", "{{ }}",
                 "{% endfor %}", "{{ raise_exception('no') }}", "", "{{" * 5000, "{% for %}" * 1000,
                 "{{ messages[99]['content'] }}", "{{ 1/0 }}", "{% set x = x + 1 %}{{ x }}",
                 "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", b"\xff\xfe invalid", "{{ messages | tojson }}"]:
        add(f"chat_template={tmpl[:40]!r}", lambda g, tmpl=tmpl: g.set("tokenizer.chat_template", T.STRING, tmpl))
    add("chat_template:uint32", lambda g: g.set("tokenizer.chat_template", T.UINT32, 3))

    # File-level fields.
    for v in [0, 1, 2, 4, 2**32 - 1]:
        add(f"version={v}", lambda g, v=v: setattr(g, "version", v))
    add("magic", lambda g: setattr(g, "magic", b"GGUG"))
    for v in [0, 3, 2**31]:
        add(f"general.alignment={v}", lambda g, v=v: g.set("general.alignment", T.UINT32, v))
    return out


def random_semantic_mutants(base: Base, n: int, rng: random.Random) -> list[Mutant]:
    """Random hyperparameters and tensor dimensions set to numbers from the edge of their range."""
    g0 = base.gguf
    numeric = []
    for key, raw in g0.kvs:
        vtype = struct.unpack_from("<I", raw)[0]
        if vtype in (T.UINT32, T.INT32, T.UINT64, T.FLOAT32):
            numeric.append((key, T(vtype)))
    out = []
    for i in range(n):
        if rng.random() < 0.75:
            key, vtype = rng.choice(numeric)
            if vtype == T.FLOAT32:
                v = rng.choice([0.0, -1.0, float("nan"), float("inf"), -1e-9, 1e38, rng.uniform(-10, 10)])
            else:
                lim = 2**32 - 1 if vtype != T.UINT64 else 2**64 - 1
                v = rng.choice([0, 1, 2, 3, 7, 64, 100000, lim, rng.randrange(0, 1000), rng.randrange(0, lim)])
                v = min(v, 2**31 - 1) if vtype == T.INT32 else v
            out.append(Mutant(f"random #{i} {key}={v}", _edit(base, lambda g, key=key, vtype=vtype, v=v: g.set(key, vtype, v))))
        else:
            t = rng.choice(g0.tensors)
            block = GGML_QUANT_SIZES[GGMLQuantizationType(t.ggml_type)][0]
            d = list(t.dims)
            j = rng.randrange(len(d))
            d[j] = rng.choice([block, d[j] * 2, max(block, d[j] - block), d[j] + block])
            out.append(Mutant(f"random #{i} shape {t.name}={d}", _edit(base, lambda g, name=t.name, d=d: g.reshape(name, d))))
    return out


def byte_mutants(base: Base, n: int, rng: random.Random) -> list[Mutant]:
    """Truncations, random bytes and huge counts in the header, the metadata and the tensor infos."""
    size = len(base.bytes)
    head = base.data_offset
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            cut = rng.choice([rng.randrange(0, 64), rng.randrange(0, head), rng.randrange(head, size)])
            out.append(Mutant(f"bytes #{i} truncate at {cut}", _patched(base, [], truncate=cut)))
        elif kind == 1:
            spot = rng.randrange(0, 32) if rng.random() < 0.2 else rng.randrange(0, head)
            patches = [(rng.randrange(0, head) if j else spot, bytes([rng.randrange(256)]))
                       for j in range(rng.choice([1, 2, 8, 64]))]
            out.append(Mutant(f"bytes #{i} random x{len(patches)} at {spot}", _patched(base, patches)))
        else:
            off, width = rng.choice(base.spots)
            v = rng.choice(HUGE + [0, 1, rng.randrange(2**(8 * width))]) % 2**(8 * width)
            out.append(Mutant(f"bytes #{i} count at {off} = {v}", _patched(base, [(off, v.to_bytes(width, "little"))])))
    return out


def all_mutants(base: Base, n_random_semantic: int, n_bytes: int, seed: int) -> list[Mutant]:
    rng = random.Random(seed)
    return semantic_mutants(base) + random_semantic_mutants(base, n_random_semantic, rng) + byte_mutants(base, n_bytes, rng)


# A runner process imports fastpar once, then forks one child per mutant: the child loads
# the mutant and generates, alone in its process, so an abort or a hang is that mutant's
# (and forking skips the interpreter's start, half of a mutant's time). The runner never
# loads a model itself, so it has no thread that a fork could leave behind.
# The child's stdout ends with its verdict:
#   raised <Error>: <message>   the load (or the context) failed with a clean error
#   loaded <finish reasons>     it loaded and generated; each prompt stopped or failed alone
RUNNER = r"""
import json, os, sys, time, traceback
import fastpar

def try_mutant(path, chat, probe):
    if probe == "abort":
        os.abort()
    if probe == "hang":
        time.sleep(3600)
    def raised(e):
        assert str(e), "an error without a message"
        print(f"raised {type(e).__name__}: {e}".replace("\n", " "))
    try:
        model = fastpar.Model(path)
        ctx = fastpar.Context(model, n_parallel=2, n_ctx_per_seq=64, n_threads=1)
    except (fastpar.ModelLoadError, fastpar.FastparError, FileNotFoundError, ValueError) as e:
        return raised(e)
    prompts = ["The capital of France is"]
    if chat:
        prompts.append([{"role": "user", "content": "Hi!"}])
    try:
        results = fastpar.generate_parallel(ctx, prompts, max_tokens=4, temperature=0.0)
    except ValueError as e:   # a chat prompt for a model without a chat template
        return raised(e)
    for c in results:
        assert c.finish_reason in ("stop", "length", "error"), c.finish_reason
        assert c.finish_reason != "error" or c.error, "a failed prompt without a message"
    del ctx, model   # freeing must not crash either
    print("loaded " + " ".join(c.finish_reason for c in results))

for line in sys.stdin:
    path, chat, probe, timeout = json.loads(line)
    out, err = path + ".out", path + ".err"
    pid = os.fork()
    if pid == 0:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 2)
        code = 0
        try:
            try_mutant(path, chat, probe)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    deadline = time.monotonic() + timeout
    status = None
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(st)
        elif time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            status = "hung"
        else:
            time.sleep(0.005)
    texts = []
    for f in (out, err):
        with open(f, errors="replace") as fh:
            texts.append(fh.read()[-4000:])
        os.remove(f)
    print(json.dumps([status] + texts), flush=True)
"""


@dataclasses.dataclass
class Outcome:
    mutant: str
    verdict: str   # "raised", "loaded", "crashed" (killed by a signal), "hung", "failed" (any other exit)
    detail: str


class Runner:
    """One runner process (see RUNNER); `run` tries one mutant in a fresh child of it."""

    def __init__(self):
        # A crash is reported by its first lines, not by a debugger's backtrace.
        env = dict(os.environ, GGML_NO_BACKTRACE="1")
        self.proc = subprocess.Popen([sys.executable, "-c", RUNNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)

    def run(self, mutant: Mutant, path: str, timeout: float) -> Outcome:
        try:
            mutant.write(path)
            self.proc.stdin.write(json.dumps([path, mutant.chat, mutant.probe, timeout]) + "\n")
            self.proc.stdin.flush()
            reply = self.proc.stdout.readline()
        finally:
            if os.path.exists(path):
                os.remove(path)
        if not reply:
            raise RuntimeError(f"the runner process died (exit {self.proc.wait()}) at mutant {mutant.name!r}")
        status, out, err = json.loads(reply)
        last = (out.strip().splitlines() or [""])[-1]
        if status == "hung":
            return Outcome(mutant.name, "hung", f"no verdict within {timeout} s")
        if status < 0:
            why = [ln for ln in err.splitlines() if "GGML_ASSERT" in ln or "error" in ln.lower()]
            return Outcome(mutant.name, "crashed", f"signal {-status}: {' | '.join(why)[-600:]}")
        if status == 0 and last.startswith(("raised ", "loaded ")):
            return Outcome(mutant.name, last.split()[0], last)
        return Outcome(mutant.name, "failed", f"exit {status}: {last} {err[-800:]}")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()
        self.proc.stdout.close()


def run_all(mutants: list[Mutant], workdir: str, timeout: float, jobs: int = 2) -> Iterator[Outcome]:
    """Runs the mutants on `jobs` runners at once; the outcomes in the mutants' order.
    Each mutant file is written just before its run and deleted right after."""
    import queue
    import threading

    todo: queue.Queue = queue.Queue()
    for i, m in enumerate(mutants):
        todo.put((i, m))
    results: dict[int, Outcome] = {}
    ready = threading.Condition()
    errors: list[BaseException] = []

    def work(j: int) -> None:
        runner = Runner()
        try:
            while True:
                try:
                    i, m = todo.get_nowait()
                except queue.Empty:
                    return
                o = runner.run(m, os.path.join(workdir, f"mutant{j}.gguf"), timeout)
                with ready:
                    results[i] = o
                    ready.notify_all()
        except BaseException as e:   # reported by the consumer below
            with ready:
                errors.append(e)
                ready.notify_all()
        finally:
            runner.close()

    threads = [threading.Thread(target=work, args=(j,), daemon=True) for j in range(jobs)]
    for t in threads:
        t.start()
    for i in range(len(mutants)):
        with ready:
            while i not in results and not errors:
                ready.wait()
            if errors:
                raise errors[0]
            o = results.pop(i)
        yield o
    for t in threads:
        t.join()
