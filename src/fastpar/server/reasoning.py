"""Thinking models' thoughts on the server: which requests split them off, and the streamed
split. The core splits a finished output (``SamplingParams(reasoning="split")``, its
csrc/core/structured/reasoning.hpp); ThoughtSplit splits the same text as it streams, so
that a stream's ``reasoning_content`` and ``content`` deltas add up to what the core returns
as ``Completion.reasoning`` and ``Completion.text``."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple

OPEN, CLOSE = "<think>", "</think>"
BLANKS = " \t\r\n"


def thinks(model: Any) -> bool:
    """Whether the model's chat template writes thoughts (<think>), as llama-server's
    ``--reasoning-format auto`` decides to split them off."""
    return OPEN in (model.chat_template or "")


def reasoning_option(body: Mapping, model_thinks: bool, bad) -> Optional[str]:
    """The request's SamplingParams ``reasoning``, where the template thinks: split by default,
    ``chat_template_kwargs.enable_thinking: false`` turns thinking off, and llama-server's
    ``reasoning_format: "none"`` leaves the thought in the content."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise bad("chat_template_kwargs", "'chat_template_kwargs' must be an object")
    enable = (kwargs or {}).get("enable_thinking")
    if enable is not None and not isinstance(enable, bool):
        raise bad("chat_template_kwargs", "'chat_template_kwargs.enable_thinking' must be a boolean")
    fmt = body.get("reasoning_format")
    if fmt is not None and fmt not in ("none", "auto", "deepseek"):
        raise bad("reasoning_format", "'reasoning_format' must be \"none\", \"auto\" or \"deepseek\"")
    if enable is False:
        return "off" if model_thinks else None  # a template that never thinks has nothing to close
    if fmt == "none" or (fmt is None and not model_thinks):
        return None
    return "split"


def opens_thought(prompt: str) -> bool:
    """Whether a rendered prompt ends inside a thought (as the core decides)."""
    return prompt.rstrip(BLANKS).endswith(OPEN)


class ThoughtSplit:
    """One output's streamed pieces as (reasoning, content) deltas. The thought loses its
    tags and surrounding blanks and the answer its leading blanks, as in the core's split;
    text that may still turn out to be a tag or such blanks is held back until it is known."""

    def __init__(self, opened: bool) -> None:
        self.state = "thought" if opened else "start"
        self.held = ""  # text not yet given out
        self.begun = False  # the thought has given out text (blanks before it are dropped)

    def feed(self, piece: str, final: bool = False) -> Tuple[str, str]:
        self.held += piece
        reasoning = content = ""
        if self.state == "start":
            rest = self.held.lstrip(BLANKS)
            if rest.startswith(OPEN):
                self.state, self.held = "thought", rest[len(OPEN):]
            elif final or not OPEN.startswith(rest):
                self.state = "answer"  # no thought: the output as it is
            else:
                return "", ""
        if self.state == "thought":
            at = self.held.find(CLOSE)
            if at >= 0:
                part, rest, ends = self.held[:at], self.held[at + len(CLOSE):], True
            else:
                keep = 0 if final else _partial(self.held, CLOSE)
                part, rest, ends = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:], final
            if not self.begun:
                part = part.lstrip(BLANKS)
            reasoning = part.rstrip(BLANKS)
            if not ends:
                rest = part[len(reasoning):] + rest  # trailing blanks wait for what follows
            self.begun = self.begun or bool(reasoning)
            self.held = rest
            if at >= 0:
                self.state = "after"
            elif final:
                self.held = ""
        if self.state == "after":
            self.held = self.held.lstrip(BLANKS)
            if self.held:
                self.state = "answer"
        if self.state == "answer":
            content, self.held = self.held, ""
        return reasoning, content


def _partial(text: str, tag: str) -> int:
    """How many characters at the end of `text` could begin `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
