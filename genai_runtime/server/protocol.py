"""OpenAI request bodies parsed strictly into ``RequestSettings`` + prompt; the error envelope.

Everything a client sends is untrusted: each field is type- and range-checked here, and a bad
one becomes an ``APIError`` naming the field (HTTP 400), never an exception deeper down.
Unknown fields are ignored (their names, not their values, are logged by the app).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..batching.settings import RequestSettings, SettingError, check_number
from ..config.bounded import LimitError, check_depth
from ..errors import GenaiRuntimeError
from .json_schemas import closed
from .tools import (
    ToolRequest,
    ToolRequestError,
    answered_call_name,
    parse_message_calls,
    parse_tools,
)

# A reply's thinking budget, as vLLM, llama.cpp's server and Qwen's API spell it (``_reasoning``)
BUDGET_FIELDS = ("thinking_token_budget", "thinking_budget_tokens", "thinking_budget")
CHAT_FIELDS = frozenset(
    [
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "n",
        "chat_template_kwargs",
        "reasoning_effort",
        "reasoning",
        *BUDGET_FIELDS,
        "best_of",
        "stop",
        "seed",
        "stream",
        "stream_options",
        "logprobs",
        "logit_bias",
        "top_logprobs",
        "response_format",
        "frequency_penalty",
        "presence_penalty",
        "user",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    ]
)
COMPLETION_FIELDS = frozenset(
    [
        "model",
        "prompt",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "n",
        "stop",
        "seed",
        "stream",
        "stream_options",
        "logprobs",
        "logit_bias",
        "echo",
        "frequency_penalty",
        "presence_penalty",
        "user",
        "suffix",
        "best_of",
    ]
)
MAX_STOP = 4
MAX_STOP_CHARS = 256
MAX_TOP_LOGPROBS = 20
MAX_TOKEN_ID = 2**31 - 1  # ids are int32 in every graph; the vocabulary check comes later
# Nesting of a response_format schema, in JSON objects/arrays. OpenAI allows 10 levels of
# objects (~20 JSON levels); 150 levels of arrays exhaust the schema checker's recursion.
MAX_SCHEMA_DEPTH = 64
# An absolute POSIX or Windows path (two components or more): shown by its last component only.
_ABSOLUTE_PATH = re.compile(
    r"""(?<![\w.~#:/-])(?:/|[A-Za-z]:\\)(?:[^\s/\\'"]+[/\\])+([^\s/\\'"]*)"""
)
ROLES = frozenset({"system", "user", "assistant", "developer", "tool"})


class APIError(Exception):
    """An error answered with OpenAI's ``{"error": {message, type, param, code}}`` body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": hide_paths(self.message),
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def hide_paths(message: str) -> str:
    """``message`` with absolute paths cut to their last component: where the server keeps its
    files is none of a client's business (errors from loading or tokenizing quote paths)."""
    return _ABSOLUTE_PATH.sub(r"\1", message)


# response_format type -> factory(model, format object) returning a logits processor
# ``(tokens, logits) -> logits`` (a grammar also has ``commit``), or None for plain text.
RESPONSE_FORMATS: dict[str, Callable[[Any, Mapping[str, Any]], Any] | None] = {
    "text": None,
    "json_schema": lambda model, fmt: _json_grammar(model, fmt),
    "json_object": lambda model, fmt: _json_grammar(model, fmt),
}


def _json_grammar(model: Any, fmt: Mapping[str, Any]) -> Any:
    """A batch-1 ``Grammar`` constraining the reply to the format's JSON schema."""
    from ..decoding.processors import LOWEST

    if fmt["type"] == "json_object":
        schema: Any = {"type": "object"}
    else:
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise bad(
                'response_format.json_schema must be an object with a "schema" object',
                "response_format",
            )
        schema = spec["schema"]
    try:
        check_depth(schema, MAX_SCHEMA_DEPTH)
    except LimitError as exc:
        raise bad(f"response_format.json_schema.schema is {exc}", "response_format") from None
    # Strict or not, an object that lists its properties and says nothing of others gets no
    # others (OpenAI's strict rule): every such reply satisfies the schema, and small models
    # otherwise invent keys until max_tokens. A schema that wants more says so.
    schema = closed(schema)
    spec = model.spec
    grammar = request_grammar(model, "json_schema", schema, "response_format")
    # A schema no JSON value satisfies ({"$ref": "#"} only refers to itself) lets the grammar
    # end at once: refuse it rather than answer an empty reply.
    allowed = grammar(np.zeros((1, 0), np.int64), np.zeros((1, model.vocab_size), np.float32))
    firsts = np.flatnonzero(allowed[0] > LOWEST)
    if not np.setdiff1d(firsts, np.asarray(spec.tokens.eos, np.int64)).size:
        grammar.close()
        raise bad(
            "response_format: no JSON value satisfies this schema (a $ref that only refers to "
            "itself?)",
            "response_format",
        )
    return grammar


def request_grammar(model: Any, kind: str, data: Any, param: str) -> Any:
    """A batch-1 ``Grammar`` for one request; what llguidance refuses is a 400 naming
    ``param``."""
    from ..decoding.guidance import Grammar  # llguidance loads only when a request asks for it

    spec = model.spec
    if spec.model_dir is None or model.vocab_size is None:
        raise bad("this model has no tokenizer.json for constrained decoding", param)
    try:
        return Grammar(
            kind, data, tokenizer_json=spec.model_dir / "tokenizer.json",
            vocab_size=model.vocab_size, eos_token_ids=spec.tokens.eos, batch_size=1, where=param,
        )  # fmt: skip
    except GenaiRuntimeError as exc:
        raise bad(str(exc)[:500], param) from None
    except RecursionError:  # a schema checker walking references without end
        raise bad(f"{param}: the schema nests too deeply", param) from None


@dataclass(frozen=True)
class ParsedRequest:
    model: str
    sampling: RequestSettings
    stream: bool = False
    include_usage: bool = False
    messages: list[dict[str, Any]] | None = None  # chat
    tools: ToolRequest | None = None  # chat: tools, tool_choice, parallel_tool_calls
    prompt: str | list[int] | None = None  # completions: the first (or only) prompt
    prompts: tuple[str | list[int], ...] = ()  # completions: every prompt, in order
    n: int = 1  # choices per prompt
    # chat: what the template is given beyond the messages (``reasoning`` reads it)
    template_fields: Mapping[str, Any] = field(default_factory=dict)
    think_prompt: str | None = None  # chat: the prompt text, when replies may think
    think_budget: int | None = None  # chat: the most tokens a reply may think (None: no bound)
    unknown: tuple[str, ...] = field(default=())

    @property
    def choices(self) -> int:
        return self.n * max(1, len(self.prompts))


def _number(body: Mapping[str, Any], key: str, low: float, high: float, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    try:
        return check_number(key, value, low, high)
    except SettingError as exc:
        raise bad(str(exc), key) from None


def _int(body: Mapping[str, Any], key: str, low: int, high: int | None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    try:
        return check_number(key, value, low, high, integer=True)
    except SettingError as exc:
        raise bad(str(exc), key) from None


def _bool(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad(f"{key} must be true or false, got {_show(value)}", key)
    return value


def _text(value: str, param: str) -> str:
    """``value`` if it is valid Unicode text. JSON may escape a lone UTF-16 surrogate
    (``"\\ud800"``), which Python keeps but no tokenizer or UTF-8 encoder accepts."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise bad(
            f"{param} holds a lone UTF-16 surrogate (\\u{ord(value[exc.start]):04x} at character "
            f"{exc.start}); send text as valid Unicode",
            param,
        ) from None
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad("stop must be a string or a list of strings", "stop")
    if len(items) > MAX_STOP:
        raise bad(f"stop takes at most {MAX_STOP} strings, got {len(items)}", "stop")
    if any(not s or len(s) > MAX_STOP_CHARS for s in items):
        raise bad(f"each stop string must have 1..{MAX_STOP_CHARS} characters", "stop")
    return tuple(_text(s, "stop") for s in items)


def _common(body: Mapping[str, Any], chat: bool) -> tuple[str, RequestSettings, bool, bool]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model is required and must be a string (a served model name)", "model")
    if body.get("echo") not in (None, False):
        raise bad("echo is not supported", "echo", "unsupported_value")
    if body.get("suffix") not in (None, ""):
        raise bad("suffix is not supported", "suffix", "unsupported_value")
    max_tokens = _int(body, "max_tokens", 1, None)
    if chat:
        extra = _int(body, "max_completion_tokens", 1, None)
        if extra is not None:
            if max_tokens is not None and max_tokens != extra:
                raise bad(
                    "max_tokens and max_completion_tokens disagree; send one",
                    "max_completion_tokens",
                )
            max_tokens = extra
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise bad("stream_options is only allowed with stream: true", "stream_options")
        if not isinstance(options, dict):
            raise bad("stream_options must be an object", "stream_options")
        include_usage = _bool(options, "include_usage")
    if chat:
        logprobs = _bool(body, "logprobs")
        top = _int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
        if top and not logprobs:
            raise bad("top_logprobs needs logprobs: true", "top_logprobs")
    else:  # the legacy form: logprobs is how many alternatives to list
        top = _int(body, "logprobs", 0, 5)
        logprobs = top is not None
        top = top or 0
    wire = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}  # OpenAI's for a field left out
    try:
        sampling = RequestSettings(
            max_tokens=max_tokens,
            **{k: default if body.get(k) is None else body[k] for k, default in wire.items()},
            seed=body.get("seed"),
            logit_bias=body.get("logit_bias"),
            presence_penalty=body.get("presence_penalty") or 0.0,
            frequency_penalty=body.get("frequency_penalty") or 0.0,
            stop=_stop(body),
            logprobs=logprobs,
            top_logprobs=top,
            response_format=_response_format(body) if chat else None,
        )
    except SettingError as exc:
        raise bad(str(exc), exc.param) from None
    return model, sampling, stream, include_usage


def _response_format(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    value = body.get("response_format")
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise bad('response_format must be an object with a "type"', "response_format")
    kind = value["type"]
    if kind not in RESPONSE_FORMATS:
        raise bad(
            f"response_format type {kind!r} is not supported; supported: "
            f"{', '.join(sorted(RESPONSE_FORMATS))}",
            "response_format",
            "unsupported_value",
        )
    return value if RESPONSE_FORMATS[kind] is not None else None


def _content(value: Any, i: int) -> str:
    where = f"messages[{i}].content"
    if isinstance(value, str):
        return _text(value, where)
    if value is None:
        return ""
    if isinstance(value, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for part in value:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise bad("only text content parts are supported", where, None)
            parts.append(part["text"])
        return _text("".join(parts), where)
    raise bad("message content must be a string or a list of text parts", f"messages[{i}]")


def parse_chat(body: Any) -> ParsedRequest:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    model, sampling, stream, usage = _common(body, chat=True)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad("messages must be a non-empty list", "messages")
    messages: list[dict[str, Any]] = []
    try:
        tools = parse_tools(body)
        for i, m in enumerate(raw):
            messages.append(_message(m, i, messages))
    except ToolRequestError as exc:
        raise bad(str(exc), exc.param) from None
    unknown = tuple(sorted(k for k in body if k not in CHAT_FIELDS))
    n = _choices(body, stream, 1)
    fields, budget = _reasoning(body)
    return ParsedRequest(
        model, sampling, stream, usage, messages=messages, tools=tools, n=n,
        template_fields=fields, think_budget=budget, unknown=unknown,
    )  # fmt: skip


def _reasoning(body: Mapping[str, Any]) -> tuple[dict[str, Any], int | None]:
    """What a chat request gives its template (``chat_template_kwargs``, ``reasoning_effort``)
    and its thinking budget. The budget's spellings: ``thinking_token_budget`` (vLLM),
    ``thinking_budget_tokens`` (llama.cpp's server), ``thinking_budget`` and ``reasoning``
    ``{"max_tokens"}`` (OpenRouter's object, whose ``effort`` is ``reasoning_effort``); -1 is
    no bound, as llama.cpp's. Spellings that disagree answer 400."""
    fields = {k: body[k] for k in ("chat_template_kwargs", "reasoning_effort") if k in body}
    given = {k: body[k] for k in BUDGET_FIELDS if body.get(k) is not None}
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise bad('reasoning must be an object ({"effort", "max_tokens"})', "reasoning")
        if reasoning.get("max_tokens") is not None:
            given["reasoning.max_tokens"] = reasoning["max_tokens"]
        effort = reasoning.get("effort")
        if effort is not None and fields.setdefault("reasoning_effort", effort) != effort:
            raise bad("reasoning.effort and reasoning_effort disagree; send one",
                      "reasoning.effort")  # fmt: skip
    budget = None
    for name, value in given.items():
        if not isinstance(value, int) or isinstance(value, bool) or not -1 <= value <= MAX_TOKEN_ID:
            raise bad(f"{name} must be an integer in [-1, {MAX_TOKEN_ID}] (-1: no bound), "
                      f"got {_show(value)}", name)  # fmt: skip
        if budget is not None and value != budget:
            raise bad(f"{name} disagrees with {next(iter(given))}; send one", name)
        budget = value
    return fields, None if budget == -1 else budget


def _message(m: Any, i: int, earlier: list[dict[str, Any]]) -> dict[str, Any]:
    """One message in the chat-template convention (tool calls with parsed arguments)."""
    if not isinstance(m, dict):
        raise bad("each message must be an object", f"messages[{i}]")
    role = m.get("role")
    if role not in ROLES:
        raise bad(
            f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}",
            f"messages[{i}].role",
        )
    message: dict[str, Any] = {"role": role, "content": _content(m.get("content"), i)}
    if m.get("tool_calls") is not None:
        if role != "assistant":
            raise bad("only assistant messages carry tool_calls", f"messages[{i}].tool_calls")
        message["tool_calls"] = parse_message_calls(m["tool_calls"], f"messages[{i}].tool_calls")
    if role == "tool":
        message["tool_call_id"] = m.get("tool_call_id")
        message["name"] = answered_call_name(earlier, i, m.get("tool_call_id"))
    return message


def parse_completion(body: Any) -> ParsedRequest:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    model, sampling, stream, usage = _common(body, chat=False)
    prompt = body.get("prompt")
    several = (
        isinstance(prompt, list)
        and bool(prompt)
        and all(isinstance(p, (str, list)) for p in prompt)
    )
    prompts = tuple(prompt) if several else (prompt,)
    if len(prompts) > MAX_CHOICES:
        raise bad(f"prompt holds {len(prompts)} prompts; at most {MAX_CHOICES}", "prompt")
    for one in prompts:
        _check_prompt(one)
    n = _choices(body, stream, len(prompts))
    unknown = tuple(sorted(k for k in body if k not in COMPLETION_FIELDS))
    return ParsedRequest(
        model, sampling, stream, usage, prompt=prompts[0], prompts=prompts, n=n, unknown=unknown
    )


def _check_prompt(prompt: Any) -> None:
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise bad(
                "prompt must be a string, a non-empty list of token ids, or a list of these",
                "prompt",
            )
        if not all(0 <= t <= MAX_TOKEN_ID for t in prompt):
            raise bad(f"prompt token ids must be in [0, {MAX_TOKEN_ID}]", "prompt")
    elif not isinstance(prompt, str) or not prompt:
        raise bad("prompt must be a non-empty string, a list of token ids, or a list of these",
                  "prompt")  # fmt: skip
    else:
        _text(prompt, "prompt")


MAX_CHOICES = 16  # choices one request may ask for (n times the prompts): each takes a slot


def _choices(body: Mapping[str, Any], stream: bool, prompts: int) -> int:
    """``n``, checked: the choices of all prompts together at most ``MAX_CHOICES``; ``best_of``
    only as ``n`` (nothing is scored to pick among more)."""
    n = _int(body, "n", 1, MAX_CHOICES) or 1
    if n * prompts > MAX_CHOICES:
        raise bad(f"n x prompts is {n * prompts}; at most {MAX_CHOICES} choices", "n")
    best = body.get("best_of")
    if best is not None and best != n:
        raise bad("best_of must equal n (choices are not scored)", "best_of", "unsupported_value")
    return n
