"""Prompts as the core takes them: text, chat messages or token ids, checked and converted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import List, Union

from . import _core

__all__ = ["Prompt"]

Message = Mapping[str, str]
Prompt = Union[str, Sequence[Message], Sequence[int]]


def _text(text: str, where: str) -> str:
    # pybind11 cannot turn a lone surrogate (from surrogateescape decoding, or a bad
    # "\ud800" literal) into UTF-8 and would refuse the whole call with a message that
    # names no argument. An ASCII str (isascii() is O(1)) cannot hold one.
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{where} is not valid text: it holds a lone surrogate "
                             f"{text[e.start]!r} at index {e.start}; fix or drop it "
                             f"(e.g. .encode('utf-8', 'replace').decode())") from None
    return str(text)  # a str subclass (numpy.str_) as a plain str


def _messages(messages: object, where: str) -> List[_core.ChatMessage]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"{where} must be a list of {{'role', 'content'}} dicts")
    out = []
    for j, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise TypeError(f"{where}[{j}] must be a dict with str 'role' and 'content', got {m!r}")
        out.append(_core.ChatMessage(_text(m["role"], f"{where}[{j}]['role']"),
                                     _text(m["content"], f"{where}[{j}]['content']")))
    return out


def _tokens(tokens: Sequence, where: str) -> List[int]:
    # Each id is checked against the vocabulary when the prompt is admitted (a bad one
    # fails that prompt alone); here only what the core's 32-bit ids cannot hold.
    out = []
    for j, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, int):
            raise TypeError(f"{where}[{j}] must be a token id (int), got {type(t).__name__}")
        if not -2**31 <= t < 2**31:
            raise ValueError(f"{where}[{j}] = {t} is no token id")
        out.append(t)
    return out


def _prompt(prompt: object, where: str):
    if isinstance(prompt, str):
        return _text(prompt, where)
    if isinstance(prompt, Sequence) and not isinstance(prompt, (bytes, bytearray)):
        if len(prompt) > 0 and isinstance(prompt[0], int) and not isinstance(prompt[0], bool):
            return _tokens(prompt, where)
        return _messages(prompt, where)
    raise TypeError(f"{where} must be a str, a list of chat messages or a list of token ids, "
                    f"got {type(prompt).__name__}")


def _prompts(prompts: object) -> list:
    # Any sized, indexable collection in order: list, tuple, 1-D numpy array of str (not a
    # registered Sequence). Not a lone str, whose characters would each become a prompt.
    bad = isinstance(prompts, (str, bytes, bytearray, Mapping))
    if not bad and not isinstance(prompts, Sequence):
        bad = not (hasattr(prompts, "__len__") and hasattr(prompts, "__getitem__")) or getattr(prompts, "ndim", 1) != 1
    if bad:
        raise TypeError("prompts must be a sequence of str (or of chat-message lists, or of token-id lists), "
                        f"got {type(prompts).__name__}")
    return [_prompt(p, f"prompts[{i}]") for i, p in enumerate(prompts)]
