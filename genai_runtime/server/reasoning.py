"""Reasoning models: the chat template's own switches, and the reply's thinking kept apart.

``chat_template_kwargs`` reach the template as variables (Qwen3's ``enable_thinking``);
``reasoning_effort`` is passed where the template reads it, else mapped onto
``enable_thinking`` ("none" and "minimal" turn thinking off). A reply of a template that writes
``<think>`` blocks is split into ``reasoning_content`` (inside the block) and ``content`` (after
it), plain or streamed; a prompt that ends inside an open block (DeepSeek-R1's) starts the reply
in the thinking. The thinking budget, and grammars that wait for the thinking to end, act on the
tokens as they are chosen: ``think_gate``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .protocol import bad

OPEN, CLOSE = "<think>", "</think>"
EFFORTS = ("none", "minimal", "low", "medium", "high")
MAX_KWARGS = 16
WHITESPACE = " \t\r\n"


def template_variables(
    body: Mapping[str, Any], template: str
) -> dict[str, str | int | float | bool | None]:
    """The variables a chat request gives its template: ``chat_template_kwargs`` (names and JSON
    scalars, checked), then ``reasoning_effort`` where the template reads it."""
    kwargs = body.get("chat_template_kwargs")
    out: dict[str, Any] = {}
    if kwargs is not None:
        if not isinstance(kwargs, dict) or len(kwargs) > MAX_KWARGS:
            raise bad(
                f"chat_template_kwargs must be an object of at most {MAX_KWARGS} entries",
                "chat_template_kwargs",
            )
        for name, value in kwargs.items():
            if not name.isidentifier() or len(name) > 64 or name.startswith("_"):
                raise bad(f"chat_template_kwargs: {name!r} is not a variable name",
                          "chat_template_kwargs")  # fmt: skip
            if not isinstance(value, (str, int, float, bool)) and value is not None:
                raise bad(f"chat_template_kwargs.{name} must be a string, number or boolean",
                          "chat_template_kwargs")  # fmt: skip
            out[name] = value
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in EFFORTS:
            raise bad(f"reasoning_effort must be one of {', '.join(EFFORTS)}", "reasoning_effort")
        if "reasoning_effort" in template:
            out.setdefault("reasoning_effort", effort)
        elif "enable_thinking" in template:
            out.setdefault("enable_thinking", effort not in ("none", "minimal"))
    return out


def reply_starts(prompt_text: str) -> str:
    """Where a reply to ``prompt_text`` starts: ``reasoning`` (the prompt ends inside an open
    block, as DeepSeek-R1's does), ``answer`` (it ends just after a closed one, as Qwen3's does
    with thinking off) or ``start`` (the reply may open a block itself)."""
    closed = prompt_text.rfind(CLOSE)
    if prompt_text.rfind(OPEN) > closed:
        return "reasoning"
    if closed >= 0 and not prompt_text[closed + len(CLOSE) :].strip(WHITESPACE):
        return "answer"
    return "start"


def thinks(template: str) -> bool:
    """Whether replies under this template may hold a thinking block."""
    return CLOSE in template


class ThinkSplitter:
    """Feed a reply's text; get ``("reasoning" | "content", text)`` pieces in order. A tail
    that could still grow into a tag is held until it is decided."""

    def __init__(self, prompt_text: str):
        opened = reply_starts(prompt_text) == "reasoning"
        self._mode = "reasoning" if opened else "start"  # start | reasoning | content
        self._buffer = ""
        self._after_close = False  # whitespace right after the block is not content

    def feed(self, text: str) -> list[tuple[str, str]]:
        self._buffer += text
        return self._step(final=False)

    def finish(self) -> list[tuple[str, str]]:
        return self._step(final=True)

    def _step(self, final: bool) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self._mode == "start":
            stripped = self._buffer.lstrip(WHITESPACE)
            if stripped.startswith(OPEN):
                self._buffer, self._mode = stripped[len(OPEN) :], "reasoning"
            elif final or (stripped and not OPEN.startswith(stripped[: len(OPEN)])):
                self._mode = "content"
            else:
                return out
        if self._mode == "reasoning":
            at = self._buffer.find(CLOSE)
            if at < 0:
                hold = 0 if final else _partial(self._buffer, CLOSE)
                cut = len(self._buffer) - hold
                ready, self._buffer = self._buffer[:cut], self._buffer[cut:]
                if ready:
                    out.append(("reasoning", ready))
                return out
            if at:
                out.append(("reasoning", self._buffer[:at]))
            self._buffer, self._mode = self._buffer[at + len(CLOSE) :], "content"
            self._after_close = True
        if self._after_close:
            self._buffer = self._buffer.lstrip(WHITESPACE)
            self._after_close = not self._buffer
        if self._buffer:
            out.append(("content", self._buffer))
            self._buffer = ""
        return out


def _partial(text: str, word: str) -> int:
    for n in range(min(len(text), len(word) - 1), 0, -1):
        if text.endswith(word[:n]):
            return n
    return 0
