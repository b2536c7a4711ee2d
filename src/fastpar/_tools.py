"""Prompts with tools: chat messages rendered by the model's Jinja template with the tools
(the core's ``render_tools``: llama.cpp's chat library, as llama-server with ``--jinja``),
and their core options given the call format's grammar and parser."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import List, Tuple

from . import _core
from ._options import SamplingParams

__all__ = ["new_tool_call_id", "render_with_tools"]


def new_tool_call_id() -> str:
    """A fresh tool-call id (``"call_"`` and 24 random characters), as ``Completion.tool_calls`` get."""
    return _core.new_tool_call_id()


def _messages_json(prompt: object, where: str) -> str:
    # OpenAI's messages: an assistant turn may hold tool_calls (content None), a tool
    # result has role "tool" and a tool_call_id; the template reads them as they are.
    if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence) or not prompt or \
            not all(isinstance(m, Mapping) for m in prompt):
        raise TypeError(f"{where} must be a list of chat messages (dicts) when tools are given")
    for j, m in enumerate(prompt):
        if not isinstance(m.get("role"), str):
            raise TypeError(f"{where}[{j}] must have a str 'role'")
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise TypeError(f"{where}[{j}]['content'] must be a str or None")
        if content is None and not m.get("tool_calls"):
            raise TypeError(f"{where}[{j}] has no content and no tool_calls")
    try:
        return json.dumps(list(prompt))
    except (TypeError, ValueError) as e:
        raise TypeError(f"{where} is not JSON-serialisable: {e}") from None


def render_with_tools(model: _core.Model, prompt: object, sp: SamplingParams, where: str) -> Tuple[str, _core.GenerateParams]:
    """The prompt's text and core options when ``sp`` has tools (the core's ``render_tools``,
    which C and R reach too): the calls' grammar (for ``required`` or a named function, and
    the generic format), the parser of the output, and the template's extra stop strings."""
    try:
        return _core.render_tools(model, _messages_json(prompt, where), sp._params)  # returns a copy
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def apply_tools(model: _core.Model, prompts: list, plist: List[SamplingParams]) -> Tuple[list, List[_core.GenerateParams]]:
    """Prompts and one core GenerateParams per prompt, those with tools rendered."""
    out_prompts, out_params = [], []
    for i, prompt in enumerate(prompts):
        sp = plist[0 if len(plist) == 1 else i]
        if sp.tools is not None:
            text, core = render_with_tools(model, prompt, sp, f"prompts[{i}]")
            out_prompts.append(text)
            out_params.append(core)
        else:
            out_prompts.append(prompt)
            out_params.append(sp._params)
    return out_prompts, out_params
