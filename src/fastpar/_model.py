"""``Model``: a GGUF file loaded once, shared by contexts and engines."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import List, Optional, Union

from . import _core, _openmp
from ._options import _MODEL_DEFAULTS, _bool, _int, _keywords_checked, _model_params
from ._prompts import Message, _messages

__all__ = ["Model"]


class Model:
    """A GGUF model loaded with llama.cpp; share one between several contexts.

    Raises ``FileNotFoundError`` for a missing file, ``fastpar.ModelLoadError`` for a file
    llama.cpp cannot load (truncated, not GGUF, unsupported architecture), ``ValueError``
    for bad options (e.g. GPU layers in a CPU-only build).
    """

    @_keywords_checked
    def __init__(self, path: Union[str, os.PathLike], *, n_gpu_layers: int = _MODEL_DEFAULTS.n_gpu_layers,
                 use_mmap: bool = _MODEL_DEFAULTS.use_mmap) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        self._model = _core.Model(os.fspath(path), _model_params(n_gpu_layers, use_mmap))
        _openmp.settled()  # llama.cpp's CPU backend has started

    @property
    def path(self) -> str:
        return self._model.path

    @property
    def n_vocab(self) -> int:
        return self._model.n_vocab

    @property
    def n_ctx_train(self) -> int:
        return self._model.n_ctx_train

    @property
    def description(self) -> str:
        return self._model.description

    @property
    def token_bos(self) -> int:
        """The beginning-of-sequence token's id; -1 for a vocabulary without one."""
        return self._model.token_bos

    @property
    def token_eos(self) -> int:
        """The end-of-sequence token's id."""
        return self._model.token_eos

    @property
    def prefix_token(self) -> int:
        """The token an empty context stands for when scoring: BOS, or EOS for a
        vocabulary without one (lm-evaluation-harness's ``prefix_token_id``)."""
        bos = self._model.token_bos
        return bos if bos >= 0 else self._model.token_eos

    @_keywords_checked
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> List[int]:
        """Token ids of ``text``. With the defaults, as generation feeds a prompt:
        ``add_special`` adds BOS (and EOS) as the vocabulary asks, ``parse_special`` turns
        special-token text (``<|im_start|>``) into its token."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self._model.tokenize(text, _bool("parse_special", parse_special), _bool("add_special", add_special))

    @_keywords_checked
    def rerank_tokens(self, query: str, document: str) -> List[int]:
        """The token ids a reranker scores for the pair, as llama-server's ``/rerank`` makes
        them: the model's rerank template (its GGUF's ``tokenizer.chat_template.rerank``) with
        ``{query}`` and ``{document}`` filled in, else ``[BOS] query [EOS] [SEP] document
        [EOS]`` as the vocabulary adds each (``fastpar.rerank`` scores these)."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, got {type(query).__name__}")
        if not isinstance(document, str):
            raise TypeError(f"document must be a str, got {type(document).__name__}")
        return self._model.rerank_prompt(query, document)

    @_keywords_checked
    def token_bytes(self, token: int) -> bytes:
        """The bytes token ``token`` stands for (a piece of a character may be part of one)."""
        return self._model.token_bytes(_int("token", token))

    @property
    def chat_template(self) -> Optional[str]:
        """The GGUF's own chat template (Jinja text), or None when it has none."""
        return self._model.chat_template

    @_keywords_checked
    def apply_chat_template(self, messages: Sequence[Message]) -> str:
        """``messages`` rendered with the model's own chat template, assistant turn opened."""
        return self._model.apply_chat_template(_messages(messages, "messages"))

    def __repr__(self) -> str:
        return f"fastpar.Model({self.path!r}, {self.description!r})"
