"""OpenAI's Responses API (``POST /v1/responses``) over the chat pipeline.

A Responses request is rewritten as a chat request (``input`` and ``instructions`` as messages,
function tools and their calls and outputs in the chat form, ``text.format`` as
``response_format``), served by the same parser, engine and tool handling, and its reply written
back as Responses output items. ``previous_response_id`` continues a conversation this server
answered: its messages and reply are kept in memory, the most recent ``MAX_STORED`` of them.
Streamed, the chat chunks become Responses events as they arrive.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from typing import Any

from .protocol import bad

MAX_STORED = 256  # responses kept for previous_response_id
ROLES = {"user", "system", "developer", "assistant"}
# Responses fields that map one to one onto chat fields
SAME = (
    "temperature", "top_p", "parallel_tool_calls", "seed", "top_k", "logit_bias", "user",
    "reasoning", "chat_template_kwargs", "thinking_token_budget", "thinking_budget_tokens",
    "thinking_budget",
)  # fmt: skip


class ResponseStore:
    """The conversations of recent responses: id -> (chat messages, tools), least recent out."""

    def __init__(self, limit: int = MAX_STORED):
        self.limit = limit
        self._items: OrderedDict[str, tuple[list[dict[str, Any]], Any]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, rid: str, messages: list[dict[str, Any]], tools: Any) -> None:
        with self._lock:
            self._items[rid] = (messages, tools)
            self._items.move_to_end(rid)
            while len(self._items) > self.limit:
                self._items.popitem(last=False)

    def get(self, rid: str) -> tuple[list[dict[str, Any]], Any]:
        with self._lock:
            if rid not in self._items:
                raise bad(
                    f"previous_response_id {rid!r} is not known here (this server keeps its "
                    f"{self.limit} most recent responses, in memory)",
                    "previous_response_id",
                )
            return self._items[rid]


def chat_body(body: Any, store: ResponseStore) -> tuple[dict[str, Any], list[dict[str, Any]], Any]:
    """The chat request a Responses request stands for, the messages its conversation holds and
    its tools in the Responses form (both for the store)."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    messages: list[dict[str, Any]] = []
    tools = body.get("tools")
    previous = body.get("previous_response_id")
    if previous is not None:
        if not isinstance(previous, str):
            raise bad("previous_response_id must be a string", "previous_response_id")
        earlier, earlier_tools = store.get(previous)
        messages = [dict(m) for m in earlier]
        tools = earlier_tools if tools is None else tools
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad("instructions must be a string", "instructions")
        messages = [m for m in messages if m["role"] != "system"]
        messages.insert(0, {"role": "system", "content": instructions})
    messages += _input_messages(body.get("input"))
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    chat.update({k: body[k] for k in SAME if k in body})
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if tools is not None:
        chat["tools"] = _chat_tools(tools)
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _chat_tool_choice(body["tool_choice"])
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        chat["response_format"] = {"type": "json_schema", "json_schema": spec}
    elif isinstance(fmt, dict) and fmt.get("type") in ("json_object", "text"):
        chat["response_format"] = {"type": fmt["type"]}
    chat["stream"] = bool(body.get("stream"))
    if chat["stream"]:
        chat["stream_options"] = {"include_usage": True}
    return chat, messages, tools


def _input_messages(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad("input must be a string or a non-empty list of items", "input")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise bad(f"{where}.role must be one of {', '.join(sorted(ROLES))}", where)
            content = _text(item.get("content"), f"{where}.content")
            out.append({"role": "system" if role == "developer" else role, "content": content})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")},
            }  # fmt: skip
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else json.dumps(output)
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            continue  # a reasoning summary from an earlier turn: nothing to show the model
        else:
            raise bad(f"{where}.type {kind!r} is not supported", f"{where}.type")
    return out


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            ok = isinstance(part, dict) and part.get("type") in ("input_text", "output_text")
            if not ok or not isinstance(part.get("text"), str):
                raise bad(f"{where}[{j}] must be input_text or output_text", f"{where}[{j}]")
            parts.append(part["text"])
        return "".join(parts)
    raise bad(f"{where} must be a string or a list of text parts", where)


def _chat_tools(tools: Any) -> Any:
    if not isinstance(tools, list):
        raise bad("tools must be a list", "tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise bad(f"tools[{i}]: only function tools are served", f"tools[{i}].type")
        function = {
            k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool
        }
        out.append({"type": "function", "function": function})
    return out


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def response(completion: Mapping[str, Any], rid: str, request: Mapping[str, Any]) -> dict[str, Any]:
    """The Responses object for a chat completion of the request's chat form."""
    choice = completion["choices"][0]
    message = choice["message"]
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append(_message_item(message["content"]))
    for call in message.get("tool_calls") or ():
        output.append(_call_item(call))
    usage = completion.get("usage") or {}
    cut = choice.get("finish_reason") == "length"
    return {
        "id": rid,
        "object": "response",
        "created_at": completion.get("created", int(time.time())),
        "model": completion.get("model"),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "output": output,
        "output_text": message.get("content") or "",
        "usage": _usage(usage),
        "instructions": request.get("instructions"),
        "previous_response_id": request.get("previous_response_id"),
        "max_output_tokens": request.get("max_output_tokens"),
        "tools": request.get("tools") or [],
        "tool_choice": request.get("tool_choice", "auto"),
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "temperature": request.get("temperature"),
        "top_p": request.get("top_p"),
        "text": request.get("text") or {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": request.get("metadata") or {},
        "store": True,
    }


def assistant_message(out: Mapping[str, Any]) -> dict[str, Any]:
    """The chat message a Responses object's output stands for (kept for the next turn)."""
    calls = [
        {"id": item["call_id"], "type": "function",
         "function": {"name": item["name"], "arguments": item["arguments"]}}
        for item in out["output"] if item["type"] == "function_call"
    ]  # fmt: skip
    message: dict[str, Any] = {"role": "assistant", "content": out["output_text"] or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _message_item(text: str) -> dict[str, Any]:
    return {
        "type": "message", "id": "msg_" + uuid.uuid4().hex[:24], "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }  # fmt: skip


def _call_item(call: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "function_call", "id": "fc_" + uuid.uuid4().hex[:24], "status": "completed",
        "call_id": call["id"], "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
    }  # fmt: skip


def _usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens_details": {"reasoning_tokens": 0},
    }  # fmt: skip


async def events(
    chunks: AsyncIterator[str], rid: str, request: Mapping[str, Any], on_done: Any
) -> AsyncIterator[str]:
    """Responses events from the chat stream's ``data:`` frames, as they arrive; ``on_done``
    gets the finished Responses object (for the store)."""
    seq = 0

    def frame(kind: str, **fields: Any) -> str:
        nonlocal seq
        seq += 1
        data = json.dumps({"type": kind, "sequence_number": seq, **fields})
        return f"event: {kind}\ndata: {data}\n\n"

    text, calls, finish, usage, created, model = "", {}, None, {}, int(time.time()), None
    item_id = "msg_" + uuid.uuid4().hex[:24]
    shell = {"id": rid, "object": "response", "created_at": created, "status": "in_progress",
             "model": request.get("model"), "output": []}  # fmt: skip
    yield frame("response.created", response=shell)
    yield frame("response.in_progress", response=shell)
    opened = False
    async for raw in chunks:
        for line in raw.splitlines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if "error" in chunk:
                yield frame("error", message=chunk["error"].get("message"), code=None)
                return
            created, model = chunk.get("created", created), chunk.get("model", model)
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    if not opened:
                        opened = True
                        item = {**_message_item(""), "id": item_id, "status": "in_progress"}
                        item["content"] = []
                        yield frame("response.output_item.added", output_index=0, item=item)
                        part = {"type": "output_text", "text": "", "annotations": []}
                        yield frame("response.content_part.added", item_id=item_id,
                                    output_index=0, content_index=0, part=part)  # fmt: skip
                    text += delta["content"]
                    yield frame("response.output_text.delta", item_id=item_id, output_index=0,
                                content_index=0, delta=delta["content"])  # fmt: skip
                for call in delta.get("tool_calls") or ():
                    slot = calls.setdefault(call["index"], {"id": "", "name": "", "arguments": ""})
                    slot["id"] += call.get("id") or ""
                    function = call.get("function") or {}
                    slot["name"] += function.get("name") or ""
                    slot["arguments"] += function.get("arguments") or ""
                finish = choice.get("finish_reason") or finish
    completion = {
        "created": created, "model": model, "usage": usage,
        "choices": [{"finish_reason": finish, "message": {
            "content": text or None,
            "tool_calls": [{"id": c["id"], "function": {"name": c["name"],
                            "arguments": c["arguments"]}} for _, c in sorted(calls.items())],
        }}],
    }  # fmt: skip
    out = response(completion, rid, request)
    if opened:
        out["output"][0]["id"] = item_id
        part = out["output"][0]["content"][0]
        yield frame("response.output_text.done", item_id=item_id, output_index=0,
                    content_index=0, text=text)  # fmt: skip
        yield frame("response.content_part.done", item_id=item_id, output_index=0,
                    content_index=0, part=part)  # fmt: skip
        yield frame("response.output_item.done", output_index=0, item=out["output"][0])
    for index, item in enumerate(out["output"][1 if opened else 0 :], start=1 if opened else 0):
        yield frame("response.output_item.added", output_index=index,
                    item={**item, "status": "in_progress", "arguments": ""})  # fmt: skip
        yield frame("response.function_call_arguments.delta", item_id=item["id"],
                    output_index=index, delta=item["arguments"])  # fmt: skip
        yield frame("response.function_call_arguments.done", item_id=item["id"],
                    output_index=index, arguments=item["arguments"])  # fmt: skip
        yield frame("response.output_item.done", output_index=index, item=item)
    on_done(out)
    done = "response.incomplete" if out["status"] == "incomplete" else "response.completed"
    yield frame(done, response=out)
