"""What the chat template is given for a request with tools, and how calls are written.

``probe`` asks the model's template once, by rendering (never by model name): does it print
``tools`` (Hugging Face's convention: the template receives the OpenAI function objects)? If so,
tools, earlier calls (``tool_calls``) and tool results (``role: tool``) go to it as they are, and
how it writes a call tells the call format (``<tool_call>`` tags, else bare JSON and its
arguments key). A template that ignores ``tools`` (SmolLM2's) gets them in our generic form
instead: a system message describing the functions and the JSON a call is, earlier calls written
as that JSON, tool results as user messages. If even that does not reach the prompt, the request
is refused (``ToolRequestError``): tools are never dropped silently.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import TokenizerError
from .tool_calls import CALL_FORMATS, OPEN
from .tools import ToolRequest, ToolRequestError

Render = Callable[..., str]  # Tokenizer.apply_chat_template


@dataclass(frozen=True)
class ToolTemplate:
    native: bool  # the template prints ``tools`` itself
    format: str  # a key of CALL_FORMATS


def probe(render: Render) -> ToolTemplate:
    """How the template takes tools, found by rendering a made-up function through it."""
    name = "probe_" + uuid.uuid4().hex[:16]
    tool = {
        "type": "function",
        "function": {
            "name": name,
            "description": "Looks a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
    user = {"role": "user", "content": "Look up the word cat."}
    offered = _try(render, [user], tools=[tool])
    if name not in offered:
        return ToolTemplate(native=False, format="generic")
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_probe", "type": "function",
             "function": {"name": name, "arguments": {"word": "cat"}}}
        ],
    }  # fmt: skip
    written = _try(render, [user, call], tools=[tool], add_generation_prompt=False)
    at = written.find(name)
    if OPEN in offered or (at >= 0 and OPEN in written[:at]):
        return ToolTemplate(native=True, format="tagged")
    # Bare JSON: the key the template writes the arguments under (Llama 3.1: "parameters").
    after = written[at:] if at >= 0 else offered[offered.find(name) :]
    keys = {key: after.find(f'"{key}"') for key in ("parameters", "arguments")}
    seen = {key: at for key, at in keys.items() if at >= 0}
    key = min(seen, key=seen.__getitem__) if seen else "parameters"
    return ToolTemplate(native=True, format="json" if key == "parameters" else "json_arguments")


def _try(render: Render, messages: list[Any], **options: Any) -> str:
    try:
        return render(messages, **options)
    except TokenizerError:  # a template that refuses tools or these roles
        return ""


def uses_tools(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the conversation holds earlier calls or tool results."""
    return any(m.get("tool_calls") or m["role"] == "tool" for m in messages)


@dataclass(frozen=True)
class TemplateInput:
    messages: list[dict[str, Any]]
    tools: list[Mapping[str, Any]] | None  # for the template's ``tools`` (None: not offered)
    instructions: str | None = None  # the generic form's system text, which must reach the prompt


def template_input(
    messages: Sequence[Mapping[str, Any]], request: ToolRequest | None, template: ToolTemplate
) -> TemplateInput:
    """The messages and tools a request's template renders."""
    offered = request is not None and request.calls_allowed
    if template.native:
        return TemplateInput(list(messages), request.definitions() if offered else None)
    out = _in_words(messages)
    if not offered:
        return TemplateInput(out, None)
    text = instructions(request)
    if out and out[0]["role"] in ("system", "developer"):
        first = out[0]["content"]
        out[0] = {**out[0], "content": f"{first}\n\n{text}" if first else text}
    else:
        out.insert(0, {"role": "system", "content": text})
    return TemplateInput(out, None, text)


def check_reaches(prompt: str, given: TemplateInput) -> None:
    """Refuse a request whose generic tool description the template left out of the prompt."""
    if given.instructions is not None and given.instructions not in prompt:
        raise ToolRequestError(
            "this model's chat template prints neither tools nor a system message, so the tool "
            "definitions cannot reach the model; serve it with a chat template that has tools",
            "tools",
        )


def _in_words(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Earlier calls as the generic JSON in the assistant's text; tool results as one user turn
    (``NAME returned: RESULT`` each), which asks the user's last question again: small models
    otherwise answer results by repeating the call they see above."""
    generic = CALL_FORMATS["generic"]
    out: list[dict[str, Any]] = []
    question = ""
    results: list[str] = []
    for m in [*messages, None]:
        if results and (m is None or m["role"] != "tool"):
            ask = f"\nAnswer in plain words: {question}" if question else ""
            out.append({"role": "user", "content": "\n".join(results) + ask})
            results = []
        if m is None:
            break
        if m["role"] == "tool":
            results.append(f"{m.get('name', 'The function')} returned: {m.get('content') or ''}")
        elif m.get("tool_calls"):
            written = generic.write([c["function"] for c in m["tool_calls"]])
            content = m.get("content") or ""
            text = f"{content}\n{written}" if content else written
            out.append({"role": m["role"], "content": text})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
            question = out[-1]["content"] if m["role"] == "user" else question
    return out


def instructions(request: ToolRequest) -> str:
    """The system text that describes the tools in the generic form."""
    lines = ["You can call these functions, each described as a JSON object:"]
    lines += [json.dumps(t.definition, ensure_ascii=False) for t in request.callable]
    several = " for one call, or a JSON array of such objects for several calls" * request.several
    lines.append(
        'To call a function, reply with only this JSON: {"name": <function name>, "arguments": '
        f"<object of arguments>}}{several}."
    )
    if request.choice == "function":
        lines.append(f"Call the function {request.named} now.")
    elif request.choice == "required":
        lines.append("Call a function now.")
    else:
        lines.append("If no function is needed, answer in plain text.")
    return "\n".join(lines)
