"""The OpenAI objects of one request's reply: whole (``final``) or as stream chunks, the
reply's thinking and tool calls taken out of its text on the way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .engine import ServerEngine
from .reasoning import ThinkSplitter
from .tool_calls import CallSplitter, ToolCall


@dataclass
class ReplyShape:
    """Builds the OpenAI response objects for one request; a ``splitter`` takes the tool calls
    out of a chat reply's text."""

    rid: str
    model: str
    created: int
    chat: bool
    engine: ServerEngine
    splitter: CallSplitter | None = None
    thinking: ThinkSplitter | None = None  # takes a reply's thinking out first
    index: int = 0  # the choice's index among the request's
    calls: int = 0  # tool calls streamed so far

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model}

    def chunk(
        self,
        *,
        text: str = "",
        entries: list | None = None,
        finish: str | None = None,
        role: bool = False,
        usage: bool = False,
        delta: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        logprobs = self._logprobs(entries) if entries else None
        if self.chat:
            if delta is None:
                delta = {}
                if role:
                    delta = {"role": "assistant", "content": ""}
                elif finish is None:
                    delta = {"content": text}
            out = self._one("chat.completion.chunk", {"delta": delta}, logprobs, finish)
        else:
            out = self._one("text_completion", {"text": text}, logprobs, finish)
        if usage:
            out["usage"] = None
        return out

    def _one(self, obj: str, body: dict[str, Any], logprobs: Any, finish: str | None) -> dict:
        """An object of ``obj`` with its one choice: ``body``, logprobs, finish."""
        out = self._head(obj)
        out["choices"] = [
            {"index": self.index, **body, "logprobs": logprobs, "finish_reason": finish}
        ]
        return out

    def deltas(self, text: str, entries: list, usage: bool) -> list[dict[str, Any]]:
        """The chunks for newly generated ``text``."""
        if self.thinking is not None:
            return self._thought(self.thinking.feed(text), entries, usage, final=False)
        if self.splitter is None:
            return [self.chunk(text=text, entries=entries, usage=usage)]
        return self._pieces(self.splitter.feed(text), entries, usage)

    def closing(self, finish: str, usage: bool) -> list[dict[str, Any]]:
        """The chunks that end the choice: held-back text or calls, then the finish reason."""
        chunks = []
        if self.thinking is not None:
            chunks = self._thought(self.thinking.finish(), [], usage, final=True)
        elif self.splitter is not None:
            chunks = self._pieces(self.splitter.finish(), [], usage)
        finish = "tool_calls" if self.calls and finish == "stop" else finish
        return [*chunks, self.chunk(finish=finish, usage=usage)]

    def _thought(self, parts: list, entries: list, usage: bool, final: bool) -> list[dict]:
        """Chunks for ``(kind, text)`` parts: thinking as ``reasoning_content``, the rest on
        through the call splitter."""
        chunks = []
        for kind, text in parts:
            if kind == "reasoning":
                delta = {"reasoning_content": text}
                chunks.append(self.chunk(delta=delta, entries=entries, usage=usage))
            elif self.splitter is None:
                chunks.append(self.chunk(text=text, entries=entries, usage=usage))
            else:
                chunks += self._pieces(self.splitter.feed(text), entries, usage)
            entries = []
        if final and self.splitter is not None:
            chunks += self._pieces(self.splitter.finish(), entries, usage)
        elif entries:
            chunks.append(self.chunk(text="", entries=entries, usage=usage))
        return chunks

    def _pieces(self, pieces: list, entries: list, usage: bool) -> list[dict[str, Any]]:
        chunks = []
        for piece in pieces:
            if isinstance(piece, str):
                chunks.append(self.chunk(text=piece, entries=entries, usage=usage))
                entries = []
                continue
            # As OpenAI streams a call: its id and name first, then the arguments.
            head = {"index": self.calls, "id": piece.id, "type": "function",
                    "function": {"name": piece.name, "arguments": ""}}  # fmt: skip
            rest = {"index": self.calls, "function": {"arguments": piece.arguments}}
            chunks.append(self.chunk(delta={"tool_calls": [head]}, entries=entries, usage=usage))
            chunks.append(self.chunk(delta={"tool_calls": [rest]}, usage=usage))
            entries = []
            self.calls += 1
        if entries:  # logprobs of tokens whose text is held back
            chunks.append(self.chunk(text="", entries=entries, usage=usage))
        return chunks

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        out = self._head("chat.completion.chunk" if self.chat else "text_completion")
        out["choices"] = []
        out["usage"] = usage
        return out

    def final(self, text: str, entries: list, finish: str, usage: dict) -> dict[str, Any]:
        logprobs = self._logprobs(entries) if entries else None
        if self.chat:
            calls: list[ToolCall] = []
            reasoning = None
            if self.thinking is not None:
                parts = self.thinking.feed(text) + self.thinking.finish()
                reasoning = "".join(t for k, t in parts if k == "reasoning")
                text = "".join(t for k, t in parts if k == "content")
            if self.splitter is not None:
                pieces = self.splitter.feed(text) + self.splitter.finish()
                text = "".join(p for p in pieces if isinstance(p, str))
                calls = [p for p in pieces if isinstance(p, ToolCall)]
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if reasoning is not None:
                message["reasoning_content"] = reasoning
            if calls:  # a reply cut by max_tokens keeps "length"
                message["tool_calls"] = [c.as_openai() for c in calls]
                finish = "tool_calls" if finish == "stop" else finish
            elif not text:
                message["content"] = ""
            out = self._one("chat.completion", {"message": message}, logprobs, finish)
        else:
            out = self._one("text_completion", {"text": text}, logprobs, finish)
        out["usage"] = usage
        return out

    def _token(self, token: int) -> tuple[str, list[int]]:
        data = self.engine.tokenizer._decode_bytes([token])
        return data.decode("utf-8", "replace"), list(data)

    def _logprobs(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
        if self.chat:
            content = []
            for e in entries:
                text, raw = self._token(e["id"])
                top = []
                for t, lp in e["top"]:
                    ttext, traw = self._token(t)
                    top.append({"token": ttext, "logprob": lp, "bytes": traw})
                content.append(
                    {"token": text, "logprob": e["logprob"], "bytes": raw, "top_logprobs": top}
                )
            return {"content": content}
        return {
            "tokens": [self._token(e["id"])[0] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{self._token(t)[0]: lp for t, lp in e["top"]} for e in entries],
        }
