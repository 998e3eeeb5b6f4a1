"""The chat-template sandbox: jinja2's immutable sandbox, with every size bounded.

A template comes from the model folder (or the caller), so it is untrusted: ``{{ 'a' * 10**8 }}``
renders 100 MB, and a few doubling steps (``{% set s = s ~ s %}``) reach any size. Here

- operations that make a big value from small ones are checked *before* they run: repetition
  (``*``), powers, ``%`` and ``format`` widths, padding (``center``, ``ljust``, ``indent``...),
  ``replace``, ``join``, ``~`` and the printing of containers;
- every value an operator, call, filter or output makes is checked after (at most ``limit``
  characters; a container counts 8 per item) and charged to the render's budget, as is every
  loop iteration, so nested loops and chains of copies end too;
- the output is counted as it streams.

``limit`` is 1 MiB plus 4 times the input's size (the messages and tools); the budget is 64
times that. A template that passes one raises ``TemplateLimitError`` (a TokenizerError to the
caller). Time is bounded through the budget (iterations, copies), not measured.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

BASE_CHARS = 1 << 20
INPUT_FACTOR = 4
BUDGET_FACTOR = 64
ITEM_COST = 8  # a list/tuple/dict entry: one pointer
MAX_INT_BITS = 1 << 16


class TemplateLimitError(Exception):
    """A template made (or was about to make) a value, output or amount of work past its limits."""


@dataclass
class _Meter:
    limit: int
    budget: int
    spent: int = 0

    def charge(self, cost: int, what: str) -> None:
        if cost > self.limit:
            raise TemplateLimitError(
                f"{what} would be {cost} characters; the limit is {self.limit}"
            )
        self.spent += cost
        if self.spent > self.budget:
            raise TemplateLimitError(
                f"the template did more work than its budget ({self.budget} characters and loop "
                f"iterations, {BUDGET_FACTOR} times the size limit)"
            )


_METER: ContextVar[_Meter | None] = ContextVar("chat_template_meter", default=None)


def _meter() -> _Meter:
    # Outside a render (jinja2 folds constants at compile time) the base limit applies.
    return _METER.get() or _Meter(BASE_CHARS, BASE_CHARS * BUDGET_FACTOR)


def text_size(value: Any, budget: int | None = None) -> int:
    """About ``len(str(value))`` without building it; stops counting once past ``budget``."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) + 2  # repr quotes when inside a container
        elif isinstance(item, dict):
            total += 2 + 4 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, bytes | bytearray):
            total += 4 * len(item)
        elif isinstance(item, int):
            total += item.bit_length() // 3 + 2
        elif isinstance(item, Mapping):
            total += 2 + 4 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            total += 2 + 2 * len(item)
            stack.extend(item)
        elif type(item).__name__ == "Namespace":  # jinja2's namespace() prints its attributes
            stack.append(object.__getattribute__(item, "_Namespace__attrs"))
        else:
            total += 32
        if budget is not None and total > budget:
            break
    return total


_CONTAINERS = (list, tuple, dict, set, frozenset)


def made(value: Any, what: str = "a value") -> Any:
    """Check and charge a value an operation made (characters, or 8 per container item)."""
    if isinstance(value, str):
        cost = len(value)
    elif isinstance(value, _CONTAINERS):
        cost = ITEM_COST * len(value)
    elif isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise TemplateLimitError(f"{what} would be a {value.bit_length()}-bit integer")
        return value
    elif isinstance(value, bytes | bytearray):
        cost = len(value)
    else:
        return value
    _meter().charge(cost, what)
    return value


def _printed(value: Any, what: str) -> None:
    """Refuse printing ``value`` when its text would pass the limit (checked before str())."""
    meter = _meter()
    size = text_size(value, meter.limit)
    if size > meter.limit:
        raise TemplateLimitError(f"{what} would be over {meter.limit} characters")


def _as_int(value: Any, default: int = 0) -> int:
    if isinstance(value, str):
        return len(value)  # indent() also takes a string
    return value if isinstance(value, int) else default


def _arg(args: tuple, kwargs: Mapping[str, Any], i: int, name: str, default: Any) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def _padded(text: Any, width: int, what: str) -> None:
    size = len(text) if isinstance(text, str) else 0
    _meter().charge(max(size, width), what)


def _replaced(text: Any, old: Any, new: Any, count: Any, what: str) -> None:
    if not (isinstance(text, str) and isinstance(old, str) and isinstance(new, str)):
        return
    hits = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    _meter().charge(len(text) + hits * max(len(new) - len(old), 0), what)


def _joined(items: Iterable[Any], sep: Any, what: str) -> list[Any]:
    items = list(items)
    meter = _meter()
    size = text_size(items, meter.limit) + (len(sep) if isinstance(sep, str) else 0) * len(items)
    meter.charge(size, what)
    return items


_WIDTH = re.compile(r"\d+")
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?")


def _format_spec(fmt: str, what: str) -> None:
    """Widths and precisions written in a format string: each is at most the limit."""
    limit = _meter().limit
    for number in _WIDTH.findall(fmt):
        if len(number) > 9 or int(number) > limit:
            raise TemplateLimitError(f"{what}: a width of {number} is over the limit of {limit}")


def _percent(fmt: Any, args: Any, what: str) -> None:
    if not isinstance(fmt, str):
        return
    for spec in _PERCENT_SPEC.finditer(fmt):
        if "*" in spec.group(0):
            raise TemplateLimitError(f"{what}: '*' widths are not allowed in a chat template")
        _format_spec(spec.group(0), what)
    _printed(args, what)


def _repeat(left: Any, right: Any) -> None:
    if isinstance(left, int) and isinstance(right, int):
        if left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise TemplateLimitError("'*' would make an integer over the size limit")
        return
    seq, times = (left, right) if isinstance(right, int) else (right, left)
    if isinstance(times, int) and isinstance(seq, str | list | tuple):
        item = 1 if isinstance(seq, str) else ITEM_COST
        _meter().charge(item * len(seq) * max(times, 0), "'*'")


def _power(base: Any, exponent: Any) -> None:
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and max(abs(base).bit_length(), 1) * max(exponent, 0) > MAX_INT_BITS
    ):
        raise TemplateLimitError("'**' would make an integer over the size limit")


def _check_call(obj: Any, args: tuple, kwargs: Mapping[str, Any]) -> tuple:
    """Pre-checks for the ``str`` methods that can make a value much bigger than their input."""
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if not isinstance(owner, str):
        return args
    what = f"str.{name}()"
    if name in ("center", "ljust", "rjust", "zfill"):
        _padded(owner, _as_int(_arg(args, kwargs, 0, "width", 0)), what)
    elif name == "expandtabs":
        tab = _as_int(_arg(args, kwargs, 0, "tabsize", 8), 8)
        _meter().charge(len(owner) + owner.count("\t") * max(tab, 0), what)
    elif name == "replace":
        _replaced(owner, _arg(args, kwargs, 0, "old", None), _arg(args, kwargs, 1, "new", None),
                  _arg(args, kwargs, 2, "count", -1), what)  # fmt: skip
    elif name == "join" and args:
        args = (_joined(args[0], owner, what), *args[1:])
    return args


# filter name -> pre-check(value, args, kwargs); the value may be replaced (a materialised list).
def _filter_checks() -> dict[str, Callable[[Any, tuple, dict], Any]]:
    def center(v, a, k):
        _padded(v, _as_int(_arg(a, k, 0, "width", 80)), "center")
        return v

    def indent(v, a, k):
        lines = v.count("\n") + 1 if isinstance(v, str) else 1
        width = _as_int(_arg(a, k, 0, "width", 4))
        _meter().charge((len(v) if isinstance(v, str) else 0) + lines * width, "indent")
        return v

    def counted(name: str, index: int, key: str):
        def check(v, a, k):
            _meter().charge(ITEM_COST * max(_as_int(_arg(a, k, index, key, 0)), 0), name)
            return v

        return check

    def fmt(v, a, k):
        _percent(v, k or a, "format")
        return v

    def replace(v, a, k):
        _replaced(v, _arg(a, k, 0, "old", None), _arg(a, k, 1, "new", None),
                  _arg(a, k, 2, "count", None), "replace")  # fmt: skip
        return v

    def join(v, a, k):
        return _joined(v, _arg(a, k, 0, "d", ""), "join")

    def printed(name: str):
        def check(v, a, k):
            if not isinstance(v, str | Iterator):
                _printed(v, name)
            return v

        return check

    def tojson(v, a, k):
        indent = _as_int(_arg(a, k, 1, "indent", 0) or 0)
        _meter().charge(text_size(v, _meter().limit) * (1 + max(indent, 0)), "tojson")
        return v

    return {
        "center": center,
        "indent": indent,
        "batch": counted("batch", 0, "linecount"),
        "slice": counted("slice", 0, "slices"),
        "format": fmt,
        "replace": replace,
        "join": join,
        "string": printed("string"),
        "pprint": printed("pprint"),
        "xmlattr": printed("xmlattr"),
        "sum": printed("sum"),
        "tojson": tojson,
    }


def _checked_filter(name: str, func: Callable[..., Any], check: Callable | None) -> Callable:
    # Filters that take the context / environment get it first; the value comes next.
    skip = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        if check is not None and len(args) > skip:
            value = check(args[skip], args[skip + 1 :], kwargs)
            args = (*args[:skip], value, *args[skip + 1 :])
        return made(func(*args, **kwargs), f"the {name} filter's result")

    return run


def _counted_iterations(iterable: Any) -> Iterator[Any]:
    meter = _meter()
    for item in iterable:
        meter.charge(ITEM_COST, "a loop")
        yield item


@functools.cache
def environment_class() -> type:
    """The bounded sandbox class (built on first use: jinja2 is imported lazily)."""
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator
    from jinja2.runtime import markup_join, str_join
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedCodeGenerator(CodeGenerator):
        def visit_Template(self, node: Any, frame: Any = None) -> None:
            # Every for-loop's iterable passes through a counting filter.
            for loop in node.find_all(nodes.For):
                loop.iter = nodes.Filter(
                    loop.iter, "_counted_iterations", [], [], None, None, lineno=loop.lineno
                )
            super().visit_Template(node, frame)

        def visit_Concat(self, node: Any, frame: Any) -> None:
            self.write("environment.checked_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            markup = "context.eval_ctx.volatile" if frame.eval_ctx.volatile else "False"
            if not frame.eval_ctx.volatile and frame.eval_ctx.autoescape:
                markup = "True"
            self.write(f"), {markup})")

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        code_generator_class = BoundedCodeGenerator
        intercepted_binops = frozenset({"*", "**", "%", "+"})

        def __init__(self, **options: Any) -> None:
            user_finalize = options.pop("finalize", None) or (lambda value: value)

            def finalize(value: Any) -> Any:
                value = user_finalize(value)
                if not isinstance(value, str):
                    _printed(value, "printed value")
                return value

            super().__init__(finalize=finalize, **options)
            self.globals.pop("lipsum", None)  # lipsum(n) makes n paragraphs
            self.concat = self.checked_join  # the buffers of set blocks, macros, call blocks

        def install_filters(self, extra: Mapping[str, Callable[..., Any]]) -> None:
            """Add ``extra`` filters, then wrap every filter with its size checks."""
            self.filters.update(extra)
            checks = _filter_checks()
            self.filters = {
                name: _checked_filter(name, func, checks.get(name))
                for name, func in self.filters.items()
            }
            self.filters["_counted_iterations"] = _counted_iterations

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "+":  # the hot one (templates build each turn with it): inlined
                result = left + right
                if type(result) is not str:
                    return made(result, "'+'")
                meter = _METER.get() or _meter()
                meter.spent += len(result)
                if len(result) > meter.limit or meter.spent > meter.budget:
                    meter.charge(len(result), "'+'")  # raises, with the message
                return result
            if operator == "*":
                _repeat(left, right)
            elif operator == "**":
                _power(left, right)
            elif operator == "%":
                _percent(left, right, "'%'")
            return made(super().call_binop(context, operator, left, right), f"'{operator}'")

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            args = _check_call(__obj, args, kwargs)
            result = super().call(__context, __obj, *args, **kwargs)
            return made(result, f"{getattr(__obj, '__name__', 'a call')}()'s result")

        def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
            wrapped = super().wrap_str_format(value)  # str.format / str.format_map, or None
            if wrapped is None:
                return None
            for _, _, spec, _ in string.Formatter().parse(value.__self__):
                if spec and "{" in spec:
                    raise TemplateLimitError("format: nested '{...}' widths are not allowed")
                if spec:
                    _format_spec(spec, "format")

            @functools.wraps(wrapped)
            def checked(*args: Any, **kwargs: Any) -> str:
                _printed((args, kwargs), "format")
                return wrapped(*args, **kwargs)

            return checked

        @staticmethod
        def checked_concat(parts: tuple, markup: bool) -> str:
            meter = _meter()
            meter.charge(text_size(parts, meter.limit), "'~'")
            return markup_join(parts) if markup else str_join(parts)

        @staticmethod
        def checked_join(parts: Iterable[str]) -> str:
            parts = list(parts)
            _meter().charge(sum(len(p) for p in parts), "a block's text")
            return "".join(parts)

    return BoundedSandbox


def render_bounded(template: Any, context: dict[str, Any], input_size: int) -> str:
    """Render ``template`` with the limits set from ``input_size`` (characters of input)."""
    limit = BASE_CHARS + INPUT_FACTOR * input_size
    meter = _Meter(limit, limit * BUDGET_FACTOR)
    token = _METER.set(meter)
    try:
        out, size = [], 0
        for chunk in template.generate(**context):
            size += len(chunk)
            if size > limit:
                raise TemplateLimitError(f"the rendered prompt is over {limit} characters")
            out.append(chunk)
        return "".join(out)
    finally:
        _METER.reset(token)
