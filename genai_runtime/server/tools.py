"""The tool fields of a chat request, checked: ``tools``, ``tool_choice``, ``parallel_tool_calls``
and the tool parts of messages (an assistant's ``tool_calls``, a ``tool`` message's
``tool_call_id``).

Everything here is client input: each problem is a ``ToolRequestError`` naming the field
(``tools[1].function.parameters``), which the protocol answers with a 400. The checked values
are kept in the Hugging Face chat-template convention: tools as OpenAI function objects, call
arguments as parsed JSON objects (templates print them with ``tojson``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..config.bounded import LimitError, check_depth
from ..errors import GenaiRuntimeError

MAX_TOOLS = 128  # OpenAI's limit
# OpenAI's rule for function names; it also keeps names out of any special token's spelling.
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_ID_CHARS = 128
MAX_DEPTH = 64  # JSON nesting of a parameters schema or of call arguments (as response_format)
FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})
CHOICES = ("auto", "none", "required")
EMPTY_PARAMETERS: Mapping[str, Any] = {"type": "object", "properties": {}}


class ToolRequestError(GenaiRuntimeError):
    """A malformed tool field; ``param`` is the field's path in the request."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: Mapping[str, Any]  # the JSON schema of the call's arguments object
    definition: Mapping[str, Any]  # {"type": "function", "function": {...}} for the template


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[Tool, ...]
    choice: str  # "auto", "none", "required" or "function" (one named function)
    named: str | None = None
    parallel: bool = True

    @property
    def calls_allowed(self) -> bool:
        """Whether the reply may hold calls (and is parsed for them)."""
        return bool(self.tools) and self.choice != "none"

    @property
    def constrained(self) -> bool:
        """Whether the reply must be a call (a grammar enforces it)."""
        return self.choice in ("required", "function")

    @property
    def callable(self) -> tuple[Tool, ...]:
        """The tools a call may name."""
        if self.choice == "function":
            return tuple(t for t in self.tools if t.name == self.named)
        return self.tools if self.calls_allowed else ()

    @property
    def several(self) -> bool:
        """Whether one reply may hold several calls: ``parallel_tool_calls``, except that a
        named function is called once (as OpenAI does)."""
        return self.parallel and self.choice != "function"

    def definitions(self) -> list[Mapping[str, Any]]:
        return [t.definition for t in self.tools]


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_text(value: Any, param: str) -> None:
    """Every string in ``value`` (keys included) is valid Unicode: JSON may escape a lone UTF-16
    surrogate, which no tokenizer or UTF-8 encoder accepts."""
    stack = [(value, param)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ToolRequestError(
                    f"{where} holds a lone UTF-16 surrogate; send text as valid Unicode", where
                ) from None
        elif isinstance(item, Mapping):
            for key, sub in item.items():
                stack.append((key, where))
                stack.append((sub, f"{where}.{key}" if NAME.fullmatch(str(key)) else where))
        elif isinstance(item, list):
            stack.extend((sub, f"{where}[{k}]") for k, sub in enumerate(item))


def _depth(value: Any, param: str) -> None:
    try:
        check_depth(value, MAX_DEPTH)
    except LimitError as exc:
        raise ToolRequestError(f"{param} is {exc}", param) from None


def _parameters(value: Any, param: str) -> Mapping[str, Any]:
    if value is None:
        return EMPTY_PARAMETERS
    if not isinstance(value, dict):
        raise ToolRequestError(f"{param} must be a JSON Schema object, got {_show(value)}", param)
    _depth(value, param)
    check_text(value, param)
    if value.get("type", "object") != "object":
        raise ToolRequestError(
            f"{param} must describe an object (arguments are a JSON object), got type "
            f"{_show(value.get('type'))}",
            param,
        )
    import jsonschema

    try:
        jsonschema.validators.validator_for(value).check_schema(value)
    except jsonschema.SchemaError as error:
        at = "/".join(str(p) for p in error.absolute_path) or "(root)"
        raise ToolRequestError(
            f"{param} is not a valid JSON Schema at {at}: {error.message[:200]}", param
        ) from None
    except RecursionError:
        raise ToolRequestError(f"{param} nests too deeply", param) from None
    return value


def _tool(value: Any, i: int) -> Tool:
    where = f"tools[{i}]"
    if not isinstance(value, dict):
        raise ToolRequestError(f"{where} must be an object", where)
    kind = value.get("type")
    if kind != "function":
        raise ToolRequestError(
            f'{where}.type must be "function" (the only tool type served), got {_show(kind)}',
            f"{where}.type",
        )
    extra = sorted(k for k in value if k not in ("type", "function"))
    if extra:
        raise ToolRequestError(f"{where} has unknown field {_show(extra[0])}", where)
    function = value.get("function")
    where += ".function"
    if not isinstance(function, dict):
        raise ToolRequestError(f"{where} must be an object with a name", where)
    extra = sorted(k for k in function if k not in FUNCTION_KEYS)
    if extra:
        raise ToolRequestError(
            f"{where} has unknown field {_show(extra[0])} (known: "
            f"{', '.join(sorted(FUNCTION_KEYS))})",
            f"{where}.{extra[0]}" if NAME.fullmatch(str(extra[0])) else where,
        )
    name = function.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ToolRequestError(
            f"{where}.name must be 1-64 characters of a-z, A-Z, 0-9, _ and -, got {_show(name)}",
            f"{where}.name",
        )
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ToolRequestError(f"{where}.description must be a string", f"{where}.description")
    check_text(description, f"{where}.description")
    if function.get("strict") not in (None, True, False):
        raise ToolRequestError(f"{where}.strict must be true or false", f"{where}.strict")
    parameters = _parameters(function.get("parameters"), f"{where}.parameters")
    definition = {"name": name}
    if description is not None:
        definition["description"] = description
    definition["parameters"] = parameters
    return Tool(name, parameters, {"type": "function", "function": definition})


def parse_tools(body: Mapping[str, Any]) -> ToolRequest | None:
    """The request's tools and how they may be called (None: no tools, no tool_choice)."""
    for old in ("functions", "function_call"):
        if body.get(old) is not None:
            raise ToolRequestError(
                f"{old} is the deprecated form; send tools and tool_choice instead", old
            )
    raw = body.get("tools")
    choice_value = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolRequestError(
            f"parallel_tool_calls must be true or false, got {_show(parallel)}",
            "parallel_tool_calls",
        )
    if raw is None and choice_value is None:
        return None
    tools: list[Tool] = []
    if raw is not None:
        if not isinstance(raw, list):
            raise ToolRequestError("tools must be a list of function tools", "tools")
        if len(raw) > MAX_TOOLS:
            raise ToolRequestError(
                f"tools takes at most {MAX_TOOLS} tools, got {len(raw)}", "tools"
            )
        seen: set[str] = set()
        for i, item in enumerate(raw):
            tool = _tool(item, i)
            if tool.name in seen:
                raise ToolRequestError(
                    f"tools[{i}].function.name {tool.name!r} is given twice",
                    f"tools[{i}].function.name",
                )
            seen.add(tool.name)
            tools.append(tool)
    choice, named = _choice(choice_value, tools)
    return ToolRequest(tuple(tools), choice, named, True if parallel is None else parallel)


def _choice(value: Any, tools: Sequence[Tool]) -> tuple[str, str | None]:
    if value is None:
        return ("auto" if tools else "none"), None
    if isinstance(value, str):
        if value not in CHOICES:
            raise ToolRequestError(
                f"tool_choice must be one of {', '.join(CHOICES)} or a function object, got "
                f"{_show(value)}",
                "tool_choice",
            )
        if value == "required" and not tools:
            raise ToolRequestError('tool_choice "required" needs tools', "tool_choice")
        return value, None
    function = value.get("function") if isinstance(value, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(value, dict) or value.get("type") != "function" or not isinstance(name, str):
        raise ToolRequestError(
            'tool_choice must be a string or {"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    if name not in {t.name for t in tools}:
        raise ToolRequestError(
            f"tool_choice names the function {_show(name)}, which is not among tools",
            "tool_choice.function.name",
        )
    return "function", name


def parse_message_calls(value: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls``, with arguments parsed to JSON objects."""
    if not isinstance(value, list):
        raise ToolRequestError(f"{where} must be a list of tool calls", where)
    calls = []
    for k, call in enumerate(value):
        at = f"{where}[{k}]"
        if not isinstance(call, dict) or call.get("type", "function") != "function":
            raise ToolRequestError(f'{at} must be a call object of type "function"', at)
        call_id = call.get("id")
        if not isinstance(call_id, str) or not 0 < len(call_id) <= MAX_ID_CHARS:
            raise ToolRequestError(
                f"{at}.id must be a string of 1..{MAX_ID_CHARS} characters", f"{at}.id"
            )
        check_text(call_id, f"{at}.id")
        function = call.get("function")
        if not isinstance(function, dict):
            raise ToolRequestError(f"{at}.function must be an object", f"{at}.function")
        name = function.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ToolRequestError(
                f"{at}.function.name must be 1-64 characters of a-z, A-Z, 0-9, _ and -",
                f"{at}.function.name",
            )
        arguments = _arguments(function.get("arguments"), f"{at}.function.arguments")
        calls.append(
            {"id": call_id, "type": "function",
             "function": {"name": name, "arguments": arguments}}
        )  # fmt: skip
    return calls


def _arguments(value: Any, where: str) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise ToolRequestError(
                f"{where} must be a JSON object encoded as a string", where
            ) from None
    if not isinstance(value, dict):
        raise ToolRequestError(f"{where} must be a JSON object encoded as a string", where)
    _depth(value, where)
    check_text(value, where)
    return value


def answered_call_name(messages: Sequence[Mapping[str, Any]], i: int, call_id: Any) -> str:
    """The function name of the earlier call ``call_id`` that tool message ``i`` answers."""
    where = f"messages[{i}].tool_call_id"
    if not isinstance(call_id, str) or not call_id:
        raise ToolRequestError(f"{where} is required on a tool message", where)
    for message in reversed(messages[:i]):
        for call in message.get("tool_calls") or ():
            if call["id"] == call_id:
                return call["function"]["name"]
    raise ToolRequestError(f"{where} answers no earlier assistant tool call with that id", where)
