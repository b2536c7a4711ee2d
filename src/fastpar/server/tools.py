"""Tool calls over HTTP: a chat request's ``tools`` and ``tool_choice`` (OpenAI's schema),
its messages with earlier calls and their results, and the calls in responses and
streams (OpenAI's ``tool_calls`` deltas: a call's id and name first, then its arguments
in pieces)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Dict, List, Optional

import fastpar
from fastpar import Completion


def tool_options(body: Mapping, bad: Callable[[str, str], Exception]) -> Optional[Dict[str, Any]]:
    """SamplingParams options for a request with tools (None without any)."""
    tools = body.get("tools")
    if tools in (None, []):
        if body.get("tool_choice") not in (None, "none", "auto"):
            raise bad("tool_choice", "'tool_choice' needs 'tools'")
        return None
    if not isinstance(tools, list):
        raise bad("tools", "'tools' must be a list of {'type': 'function', 'function': {...}} objects")
    for i, t in enumerate(tools):
        if not isinstance(t, Mapping) or t.get("type", "function") != "function":
            raise bad(f"tools[{i}]", f"'tools[{i}]' must be a {{'type': 'function', 'function': {{...}}}} object")
    parallel = body.get("parallel_tool_calls", False)
    if not isinstance(parallel, bool):
        raise bad("parallel_tool_calls", "'parallel_tool_calls' must be a boolean")
    return {"tools": tools, "tool_choice": body.get("tool_choice"), "parallel_tool_calls": parallel}


def tool_messages(body: Mapping, content: Callable[[Any, str], str], bad: Callable[[str, str], Exception]) -> List[dict]:
    """The messages of a request with tools, as the template reads them: an assistant's
    ``tool_calls`` (content may be null) and a ``tool`` message's ``tool_call_id`` kept."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "'messages' must be a non-empty list of {'role', 'content'} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise bad(f"messages[{i}]", f"'messages[{i}]' must be an object with a string 'role'")
        msg: Dict[str, Any] = {"role": "system" if m["role"] == "developer" else m["role"]}
        calls = m.get("tool_calls")
        if calls:
            if m["role"] != "assistant" or not isinstance(calls, list):
                raise bad(f"messages[{i}].tool_calls", f"'messages[{i}].tool_calls' must be an assistant's list")
            for j, c in enumerate(calls):
                fn = c.get("function") if isinstance(c, Mapping) else None
                if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or \
                        not isinstance(fn.get("arguments"), (str, Mapping)):
                    raise bad(f"messages[{i}].tool_calls[{j}]", f"'messages[{i}].tool_calls[{j}]' must be "
                              "{'id', 'type': 'function', 'function': {'name', 'arguments'}}")
            msg["tool_calls"] = calls
            msg["content"] = None if m.get("content") is None else content(m["content"], f"messages[{i}].content")
        else:
            msg["content"] = content(m.get("content"), f"messages[{i}].content")
        for key in ("tool_call_id", "name"):
            if isinstance(m.get(key), str):
                msg[key] = m[key]
        out.append(msg)
    return out


def message_calls(c: Completion) -> List[Dict[str, Any]]:
    """A completion's calls as OpenAI's message ``tool_calls``."""
    return [{"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
            for t in c.tool_calls]


class ToolStream:
    """One sample's stream with tools: content and calls as deltas, read from the text
    streamed so far by the request's parser (complete calls only), then from the finished
    completion; a call's id and name come in its first delta, its arguments after."""

    def __init__(self, request: fastpar.Request) -> None:
        self._request = request
        self._text = ""
        self._content = ""
        self._calls: List[List[str]] = []  # per call announced: [id, arguments sent]

    def _deltas(self, content: str, calls: List[Any], ids: Optional[List[str]]) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = []
        if content.startswith(self._content) and len(content) > len(self._content):
            out.append({"content": content[len(self._content):]})
            self._content = content
        for i, call in enumerate(calls):
            if i == len(self._calls):
                self._calls.append([ids[i] if ids else fastpar.new_tool_call_id(), ""])
                out.append({"tool_calls": [{"index": i, "id": self._calls[i][0], "type": "function",
                                            "function": {"name": call.name, "arguments": ""}}]})
            sent = self._calls[i][1]
            if call.arguments.startswith(sent) and len(call.arguments) > len(sent):
                out.append({"tool_calls": [{"index": i, "function": {"arguments": call.arguments[len(sent):]}}]})
                self._calls[i][1] = call.arguments
        return out

    def feed(self, piece: str) -> List[Dict[str, Any]]:
        self._text += piece
        if not piece:
            return []
        reply = self._request.reply_so_far(self._text)
        return self._deltas(reply.content, list(reply.tool_calls), None)

    def finish(self, c: Completion) -> List[Dict[str, Any]]:
        return self._deltas(c.text, list(c.tool_calls), [t.id for t in c.tool_calls])
