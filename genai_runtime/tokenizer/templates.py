"""Chat templates: jinja2 in a bounded sandbox (``sandbox.py``), configured like Hugging Face
transformers.

A folder's templates come from ``chat_template.jinja``, else ``tokenizer_config.json``'s
``chat_template`` (one string, or a list of named ones), else ``chat_template.json``. Message
text is data passed to the template, never template source.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..config.bounded import TOKENIZER_LIMITS, LimitError, clip_text, load_json, read_bounded
from ..errors import TokenizerError
from ..folder_paths import folder_file
from .files import read_json
from .sandbox import TemplateLimitError, environment_class, render_bounded, text_size


class _TemplateRaised(Exception):
    """Raised by a template's ``raise_exception(...)`` call."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Hugging Face's tojson: no HTML escaping, non-ASCII kept (jinja2's built-in escapes both).
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=1)
def _template_env():
    # Built here: jinja2 is only needed once a chat template is rendered.
    import jinja2.ext

    env = environment_class()(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols],
        # None prints as "" (the reference does this; plain jinja2 would print "None").
        finalize=lambda value: "" if value is None else value,
    )
    env.install_filters({"tojson": _tojson})
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=32)
def compile_template(source: str):
    import jinja2

    try:
        return _template_env().from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TokenizerError(f"chat template does not compile: {exc} (line {exc.lineno})") from exc


def json_arg(value: Any, what: str) -> Any:
    """A JSON string (the reference's form) or an already-parsed Python value."""
    if not isinstance(value, str):
        return value
    try:
        return load_json(value, TOKENIZER_LIMITS)
    except ValueError as exc:  # JSONDecodeError, LimitError
        raise TokenizerError(f"{what} is not valid JSON: {clip_text(str(exc))}") from exc


def tool_definitions(tools: Any) -> list[Any] | None:
    """``tools`` as the template receives it, as transformers passes it: None, or a list of
    tool objects (JSON schemas of functions), given as such or as a JSON string."""
    if tools is None or (isinstance(tools, str) and not tools):
        return None
    parsed = json_arg(tools, "tools")
    if not isinstance(parsed, list) or not all(isinstance(t, Mapping) for t in parsed):
        raise TokenizerError(
            'tools must be a JSON array of tool objects, e.g. [{"type": "function", '
            '"function": {"name": "f", "parameters": {...}}}]'
        )
    return parsed


def locate_strings(
    render: Callable[[Any, Any], str],
    messages: Any,
    tools: Any,
    risky: Callable[[str], bool],
) -> tuple[str, list[tuple[int, int]] | None, list[str]]:
    """``render(messages, tools)``; where request strings landed in it (sorted ``[start, end)``
    character spans, or None when that cannot be told for sure); and the paths of the strings
    ``risky`` flags (``messages[2].tool_calls[0].function.arguments.city``).

    Placed are every message's string ``content`` and, anywhere else in the messages or tools
    (keys too, roles excepted), every string ``risky`` flags. Found by rendering once more with
    a unique marker in place of each: if putting the strings back in place of the markers, as
    written, stripped (templates that ``trim``) or JSON-escaped (``tojson``), gives the real
    rendering, the spans are exact. A template that reshapes or tests the text gives another
    text, hence None.
    """
    text = render(messages, tools)
    if not isinstance(messages, list):
        return text, None, []
    marks = _Marks(risky)
    marked_messages = [marks.message(m, f"messages[{i}]") for i, m in enumerate(messages)]
    marked_tools = marks.walk(tools, "tools")
    if not marks.values:
        return text, [], marks.risky
    try:
        skeleton = render(marked_messages, marked_tools)
    except TokenizerError:
        return text, None, marks.risky
    return text, _place(text, skeleton, marks), marks.risky


class _Marks:
    """Strings swapped for unique markers (``values``: marker -> string)."""

    def __init__(self, risky: Callable[[str], bool]):
        self.tag = f"\ue000{uuid.uuid4().hex}:"
        self.values: dict[str, str] = {}
        self.risky: list[str] = []
        self._is_risky = risky

    def mark(self, value: str, path: str, always: bool = False) -> str:
        danger = self._is_risky(value)
        if danger:
            self.risky.append(path)
        if not value or not (always or danger):
            return value
        marker = f"{self.tag}{len(self.values)}\ue001"
        self.values[marker] = value
        return marker

    def message(self, m: Any, path: str) -> Any:
        if not isinstance(m, Mapping):
            return m
        out = {}
        for key, value in m.items():
            if key == "content" and isinstance(value, str):
                out[key] = self.mark(value, f"{path}.content", always=True)
            else:
                out[key] = value if key == "role" else self.walk(value, f"{path}.{key}")
        return out

    def walk(self, value: Any, path: str) -> Any:
        if isinstance(value, str):
            return self.mark(value, path)
        if isinstance(value, Mapping):
            return {
                (self.mark(k, path) if isinstance(k, str) else k): self.walk(v, f"{path}.{k}")
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [self.walk(v, f"{path}[{i}]") for i, v in enumerate(value)]
        return value


def _forms(value: str) -> list[str]:
    """How a template may print a string: as is, JSON-escaped (``tojson``), stripped."""
    forms = [value, json.dumps(value, ensure_ascii=False)[1:-1], value.strip()]
    return list(dict.fromkeys(forms))


def _place(text: str, skeleton: str, marks: _Marks) -> list[tuple[int, int]] | None:
    parts = re.split(f"({re.escape(marks.tag)}\\d+\ue001)", skeleton)
    spans, at = [], 0
    for k, part in enumerate(parts):
        if k % 2 == 0:  # the template's own text
            if not text.startswith(part, at):
                return None
            at += len(part)
            continue
        value = marks.values.get(part)
        if value is None:
            return None
        after = parts[k + 1]
        for form in _forms(value):
            if text.startswith(form, at) and text.startswith(after, at + len(form)):
                break
        else:
            return None
        if form:
            spans.append((at, at + len(form)))
        at += len(form)
    return sorted(spans) if at == len(text) else None


class ChatTemplates:
    """A folder's named chat templates ("default", "tool_use", ...), rendered on request."""

    def __init__(self, templates: Mapping[str, str], model_dir: Path):
        self.templates = dict(templates)
        self.model_dir = model_dir

    @classmethod
    def load(
        cls, model_dir: Path, cfg: Mapping[str, Any], root: Path | None = None
    ) -> ChatTemplates:
        """Named chat templates: chat_template.jinja, else tokenizer_config.json, else
        chat_template.json. A single template is stored under "default". Template files must
        resolve inside the folder (or ``root``)."""
        return cls(_read_templates(model_dir, cfg, root), model_dir)

    def check(self) -> None:
        """Compile every template (``validate``): a syntax error is a ``TokenizerError``."""
        for source in self.templates.values():
            compile_template(source)

    def render(
        self,
        messages: str | Sequence[Mapping[str, Any]],
        *,
        template_str: str | None,
        tools: str | Sequence[Any] | None,
        add_generation_prompt: bool,
        special_text: Mapping[str, str],
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text for ``messages`` (a JSON string or a list of dicts); ``variables``
        are further names the template reads (``enable_thinking``), never replacing these."""
        parsed = json_arg(messages, "messages")
        if not isinstance(parsed, list) or not all(isinstance(m, Mapping) for m in parsed):
            raise TokenizerError(
                'messages must be a JSON array of objects, e.g. [{"role": "user", "content": "Hi"}]'
            )
        if template_str is not None and not isinstance(template_str, str):
            kind = type(template_str).__name__
            raise TokenizerError(f"apply_chat_template(template_str): expected a str, got {kind}")
        tool_list = tool_definitions(tools)
        source = template_str or self.pick(tool_list is not None)
        template = compile_template(source)
        context: dict[str, Any] = {**(variables or {}), **special_text}
        context.update(
            messages=parsed, tools=tool_list, add_generation_prompt=bool(add_generation_prompt)
        )
        size = text_size(parsed) + text_size(tool_list) + text_size(dict(special_text))
        size += text_size(dict(variables or {}))
        try:
            return render_bounded(template, context, size)
        except TemplateLimitError as exc:
            raise TokenizerError(f"chat template refused: {exc}") from None
        except _TemplateRaised as exc:
            raise TokenizerError(f"chat template raised an error: {exc}") from exc
        except Exception as exc:  # undefined names, type errors, sandbox violations...
            raise TokenizerError(f"chat template failed: {type(exc).__name__}: {exc}") from exc

    def pick(self, with_tools: bool) -> str:
        if with_tools and "tool_use" in self.templates:
            return self.templates["tool_use"]
        if "default" in self.templates:
            return self.templates["default"]
        if self.templates:
            names = ", ".join(sorted(self.templates))
            raise TokenizerError(
                f"tokenizer_config.json in {self.model_dir} has chat templates ({names}) but none "
                "named 'default'; pass one with apply_chat_template(..., template_str=...)"
            )
        raise TokenizerError(
            f"no chat template in {self.model_dir} (no chat_template.jinja, no 'chat_template' in "
            "tokenizer_config.json); pass one with apply_chat_template(..., template_str=...)"
        )


def _read_templates(model_dir: Path, cfg: Mapping[str, Any], root: Path | None) -> dict[str, str]:
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        folder_file(model_dir, jinja_file.name, root)
        try:
            return {"default": read_bounded(jinja_file, TOKENIZER_LIMITS.max_bytes)}
        except (OSError, UnicodeDecodeError, LimitError) as exc:
            raise TokenizerError(f"cannot read {jinja_file}: {clip_text(str(exc))}") from exc
    source: Any = cfg.get("chat_template")
    if not source and (model_dir / "chat_template.json").is_file():
        extra = read_json(folder_file(model_dir, "chat_template.json", root), "chat template")
        source = extra.get("chat_template") if isinstance(extra, dict) else None
    if isinstance(source, str) and source:
        return {"default": source}
    if isinstance(source, list):
        return {
            str(t.get("name")): t["template"]
            for t in source
            if isinstance(t, Mapping) and isinstance(t.get("template"), str)
        }
    return {}
