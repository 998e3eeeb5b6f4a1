"""How a model writes tool calls: the grammar that forces one, and the parser that finds them.

Formats (``CALL_FORMATS``), chosen by what the chat template renders (``tool_prompt.probe``):

- ``tagged``: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block per
  call (Qwen2.5, Hermes and the templates that copy them);
- ``json``: the reply is one JSON object ``{"name": ..., "parameters": {...}}`` (Llama 3.1's
  JSON tool calling; ``arguments`` where the template writes calls with that key);
- ``generic``: ours, for templates with no tool support (the server describes the tools in a
  system message): a JSON object ``{"name": ..., "arguments": {...}}``, or a JSON array of them.

The parser (``CallSplitter``) reads every format, whatever the template: blocks in tags
anywhere in the reply, or a reply that is JSON from its first character, also inside a Markdown
fence (```` ```json ````: Qwen2.5-Coder-1.5B writes its calls so under ``auto``), or in doubled
braces as Qwen2.5's template shows the format. Names it does not know and text that does not
parse stay content. It takes the reply piece by piece, so a streamed
reply splits into exactly the content and calls of the whole one.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..decoding.guidance import JSON_LAYOUT
from .json_schemas import closed, rerooted
from .tools import Tool

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
FENCE = "```"
WHITESPACE = " \t\r\n"


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as OpenAI sends it

    def as_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(frozen=True)
class CallFormat:
    """One way of writing calls: wrapped in tags or bare JSON, the arguments' key, and whether
    several calls may be written as one JSON array."""

    tagged: bool
    arguments_key: str
    json_array: bool

    def grammar(
        self, tools: Iterable[Tool], parallel: bool, tag_ids: Mapping[str, int] | None = None
    ) -> str:
        """An llguidance Lark grammar accepting calls to ``tools`` in the forms the parser reads
        (``CallSplitter``) that this format's models write: tagged blocks (tagged formats), one
        bare JSON call (or an array of them where ``parallel`` and the format writes arrays), or
        that JSON in a Markdown fence (coder models write calls so unforced). The model is held
        to calls, not to one way of writing them, so a reply it writes unforced passes unchanged
        and it may end after any complete call; without ``parallel``, exactly one call.
        ``tag_ids``: the tags the tokenizer writes as one token of their own (``tag_tokens``),
        named by id: llguidance reads such a token as special, never as the tag's text
        (Qwen2.5's ``<tool_call>``)."""
        tools = list(tools)
        several = parallel and self.json_array
        rules = [
            "start: json | fenced",
            'fenced: "```" "json"? "\\n" json "\\n```"',
            f"json: %json {json.dumps(self._schema(tools, several))}",
        ]
        if self.tagged:
            ids = tag_ids or {}
            opening, closing = (
                f"<[{ids[t]}]>" if t in ids else json.dumps(t) for t in (OPEN, CLOSE)
            )
            repeat = ' ("\\n" call)*' if parallel else ""
            rules[0] = f"start: call{repeat} | json | fenced"
            rules.append(f'call: {opening} "\\n" one "\\n" {closing}')
            rules.append(f"one: %json {json.dumps(self._schema(tools, False))}")
        return "\n".join([*rules, ""])

    def _schema(self, tools: Iterable[Tool], several: bool) -> dict[str, Any]:
        tools = list(tools)
        # where each tool's parameters sit in this schema, for their own $refs
        base = "#/anyOf/0" if several else "#"
        key = self.arguments_key
        at = [
            f"{base}/properties/{key}" if len(tools) == 1 else f"{base}/anyOf/{i}/properties/{key}"
            for i in range(len(tools))
        ]
        one = [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, key: closed(rerooted(t.parameters, p))},
                "required": ["name", key],
                "additionalProperties": False,
            }
            for t, p in zip(tools, at)
        ]
        call: dict[str, Any] = one[0] if len(one) == 1 else {"anyOf": one}
        if several:
            call = {"anyOf": [call, {"type": "array", "items": call, "minItems": 1}]}
        # One layout (", " and ": ", no other whitespace): small models otherwise wander into
        # endless legal whitespace, as for response_format.
        return {**call, "x-guidance": JSON_LAYOUT}

    def write(self, calls: Iterable[Mapping[str, Any]]) -> str:
        """Earlier calls (``{"name", "arguments"}``, arguments parsed) as the model writes them."""
        objects = [{"name": c["name"], self.arguments_key: c["arguments"]} for c in calls]
        if self.tagged:
            return "\n".join(
                f"{OPEN}\n{json.dumps(o, ensure_ascii=False)}\n{CLOSE}" for o in objects
            )
        if len(objects) == 1 or not self.json_array:
            return "\n".join(json.dumps(o, ensure_ascii=False) for o in objects)
        return json.dumps(objects, ensure_ascii=False)


def tag_tokens(encode: Callable[[str], Sequence[int]]) -> dict[str, int]:
    """The call tags that ``encode`` (the model's tokenizer) turns into one token each."""
    out = {}
    for tag in (OPEN, CLOSE):
        ids = encode(tag)
        if len(ids) == 1:
            out[tag] = int(ids[0])
    return out


CALL_FORMATS: dict[str, CallFormat] = {
    "tagged": CallFormat(tagged=True, arguments_key="arguments", json_array=False),
    "json": CallFormat(tagged=False, arguments_key="parameters", json_array=False),
    "json_arguments": CallFormat(tagged=False, arguments_key="arguments", json_array=False),
    "generic": CallFormat(tagged=False, arguments_key="arguments", json_array=True),
}


def _as_calls(value: Any, names: frozenset[str]) -> list[ToolCall] | None:
    """The calls a parsed JSON value spells (an object or a list of objects), or None if any
    part of it is not a call to a known function."""
    items = value if isinstance(value, list) and value else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or item.get("name") not in names:
            return None
        arguments = item.get("arguments", item.get("parameters"))
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError):
                return None
        if not isinstance(arguments, dict):
            return None
        text = json.dumps(arguments, ensure_ascii=False)
        calls.append(ToolCall(new_call_id(), item["name"], text))
    return calls


def _decode(text: str) -> tuple[Any, int]:
    """The JSON value ``text`` opens with and where it ends; a call in doubled braces,
    ``{{"name": ..., "arguments": {...}}}``, reads as the object inside them (Qwen2.5's template
    shows the call format so, and its small models copy it). ValueError if neither parses."""
    try:
        return json.JSONDecoder().raw_decode(text)
    except (ValueError, RecursionError):
        if not text.startswith("{{"):
            raise ValueError("not JSON") from None
    value, end = json.JSONDecoder().raw_decode(text, 1)
    close = len(text) - len(text[end:].lstrip(WHITESPACE))
    if not isinstance(value, dict) or text[close : close + 1] != "}":
        raise ValueError("not JSON")
    return value, close + 1


def _parse(text: str, names: frozenset[str]) -> list[ToolCall] | None:
    try:
        value, end = _decode(text)
    except (ValueError, RecursionError):
        return None
    return _as_calls(value, names) if not text[end:].strip(WHITESPACE) else None


def _fenced_json(text: str) -> bool | None:
    """Whether ``text`` (a reply from its first non-blank character) opens a Markdown fence of
    JSON: a ```` ``` ```` or ```` ```json ```` line, then ``{`` or ``[``; None while too short
    to tell."""
    if not text.startswith(FENCE):
        return None if FENCE.startswith(text) else False
    line_end = text.find("\n")
    language = text[len(FENCE) : len(text) if line_end < 0 else line_end].strip().lower()
    if language not in ("", "json"):
        return None if line_end < 0 and "json".startswith(language) else False
    if line_end < 0:
        return None
    body = text[line_end + 1 :].lstrip(WHITESPACE)
    return (body[0] in "{[") if body else None


def _partial_suffix(text: str, word: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``word``."""
    for n in range(min(len(text), len(word) - 1), 0, -1):
        if text.endswith(word[:n]):
            return n
    return 0


Piece = str | ToolCall  # content text, or one call


class CallSplitter:
    """Splits a reply into content and calls as it arrives: ``feed(text)`` and, once the reply
    ended, ``finish()`` return the pieces now certain, in order.

    Whitespace next to a call is not content. Content that could still turn out to be the start
    of a call (a reply opening with ``{`` or ``[``, a tail that may grow into ``<tool_call>``)
    is held until it is decided, so the pieces do not depend on how the text was cut. With
    ``parallel`` False, calls after the first are dropped.
    """

    def __init__(self, names: Iterable[str], parallel: bool = True):
        self.names = frozenset(names)
        self.parallel = parallel
        self.calls = 0
        self._mode = "start"  # start | json | text | call
        self._buffer = ""  # text not yet decided
        self._space = ""  # whitespace after content, dropped if a call comes next
        self._after_call = False  # whitespace right after a call is dropped too

    def feed(self, text: str) -> list[Piece]:
        self._buffer += text
        out: list[Piece] = []
        while True:
            before = (self._mode, len(self._buffer))
            self._step(out, final=False)
            if (self._mode, len(self._buffer)) == before:
                return _merge(out)

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        self._step(out, final=True)
        if self._space and not self.calls:
            out.append(self._space)
        self._space = ""
        return _merge(out)

    def _step(self, out: list[Piece], final: bool) -> None:
        if self._mode == "start":
            stripped = self._buffer.lstrip(WHITESPACE)
            if not stripped:
                if final:
                    self._content(out, self._buffer)
                    self._buffer = ""
                return
            if stripped[0] == "`":
                opens = _fenced_json(stripped)
                if opens is None and not final:
                    return  # not yet decided
                self._mode = "json" if opens else "text"
            else:
                self._mode = "json" if stripped[0] in "{[" else "text"
        if self._mode == "json":
            if final:
                self._json(out)
        elif self._mode == "text":
            self._text(out, final)
        else:
            self._call(out, final)

    def _json(self, out: list[Piece]) -> None:
        """A reply that opened with JSON: calls (several may follow one another, apart by
        whitespace, ``;`` or ``,``), then perhaps words; or, if the JSON is no call, content."""
        text, self._buffer = self._buffer, ""
        rest, found = text.lstrip(WHITESPACE), []
        fenced = rest.startswith(FENCE)
        if fenced:  # past the opening line (```json): _fenced_json saw JSON after it
            rest = rest[rest.index("\n") + 1 :].lstrip(WHITESPACE)
        while rest[:1] in ("{", "["):
            try:
                value, end = _decode(rest)
            except (ValueError, RecursionError):
                break
            calls = _as_calls(value, self.names)
            if calls is None:
                break
            found += calls
            rest = rest[end:].lstrip(WHITESPACE + ";,")
        if not found:
            if _cut_call(rest, self.names):  # a call the reply ended inside: not content
                return
            return self._content(out, text)
        if fenced and rest.startswith(FENCE):
            rest = rest[len(FENCE) :]
        for call in found:
            self._emit(out, call)
        self._mode = "text"
        self._buffer = rest
        self._text(out, final=True)

    def _text(self, out: list[Piece], final: bool) -> None:
        at = self._buffer.find(OPEN)
        if at >= 0:
            self._content(out, self._buffer[:at])
            self._buffer = self._buffer[at + len(OPEN) :]
            self._mode = "call"
            if final:
                self._call(out, final)
            return
        hold = 0 if final else _partial_suffix(self._buffer, OPEN)
        ready = self._buffer[: len(self._buffer) - hold]
        self._buffer = self._buffer[len(ready) :]
        self._content(out, ready)

    def _call(self, out: list[Piece], final: bool) -> None:
        at = self._buffer.find(CLOSE)
        if at < 0 and not final:
            return
        if at < 0 and _cut_call(self._buffer, self.names):  # the reply ended inside a call
            self._buffer, self._mode = "", "text"
            return
        end = len(self._buffer) if at < 0 else at + len(CLOSE)
        body = self._buffer[: len(self._buffer) if at < 0 else at]
        block, self._buffer = OPEN + self._buffer[:end], self._buffer[end:]
        self._mode = "text"
        calls = _parse(body.strip(WHITESPACE), self.names)
        if calls is None:  # not a call after all: the block is text
            self._content(out, block)
        else:
            for call in calls:
                self._emit(out, call)
        if final:
            self._text(out, final)

    def _content(self, out: list[Piece], text: str) -> None:
        if self._after_call:
            text = text.lstrip(WHITESPACE)
            if not text:
                return
            self._after_call = False
        body = text.rstrip(WHITESPACE)
        if body:
            out.append(self._space + body)
            self._space = ""
        self._space += text[len(body) :]

    def _emit(self, out: list[Piece], call: ToolCall) -> None:
        self._space = ""
        self._after_call = True
        if self.parallel or not self.calls:
            out.append(call)
        self.calls += 1


_NAMED = re.compile(r'"name"\s*:\s*"([^"\\]*)"?')


def _cut_call(text: str, names: frozenset[str]) -> bool:
    """Whether ``text`` is the start of a call that never ended: JSON that does not parse
    whole, naming a known function (or not yet naming anything after ``"name"``)."""
    body = text.strip(WHITESPACE).removeprefix(FENCE).removeprefix("json").strip(WHITESPACE)
    if not body:
        return True  # a call block opened, then the reply ended
    try:
        json.loads(body)
        return False  # whole JSON: a call or not, the parser has decided
    except (ValueError, RecursionError):
        pass
    named = _NAMED.search(body)
    if named is None:
        return (body[:1] in "{[" and '"name"' in body) or body in ("{", "[")
    return named.group(1) in names or any(n.startswith(named.group(1)) for n in names)


def split_reply(text: str, names: Iterable[str], parallel: bool = True) -> list[Piece]:
    """The pieces of a whole reply (what a stream of it splits into, merged)."""
    splitter = CallSplitter(names, parallel)
    return _merge(splitter.feed(text) + splitter.finish())


def _merge(pieces: list[Piece]) -> list[Piece]:
    merged: list[Piece] = []
    for piece in pieces:
        if isinstance(piece, str) and merged and isinstance(merged[-1], str):
            merged[-1] += piece
        else:
            merged.append(piece)
    return merged
