"""Bounded reading of the JSON and YAML files a model folder carries (all untrusted input).

One mechanism for every config, tokenizer and chat-template file: a byte cap checked before
reading, a nesting-depth cap (deep documents would otherwise end in ``RecursionError`` in the
parser or in whatever walks the result), and for YAML a cap on aliases and on the size of the
document once aliases are expanded (a "billion laughs" file is tiny on disk and endless in
memory), with self-referencing anchors refused. Callers turn ``LimitError`` into their own
``GenaiRuntimeError`` subclass.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CONFIG_LIMITS",
    "TOKENIZER_LIMITS",
    "LimitError",
    "Limits",
    "check_depth",
    "clip_text",
    "load_json",
    "load_yaml",
    "read_bounded",
]


class LimitError(ValueError):
    """A document breaks one of the ``Limits`` (or cannot be parsed within them)."""


@dataclass(frozen=True)
class Limits:
    max_bytes: int
    max_depth: int
    max_nodes: int  # YAML: values after alias expansion
    max_aliases: int


# genai_config files are a few KiB and about 8 levels deep; the caps leave wide room.
CONFIG_LIMITS = Limits(max_bytes=16 << 20, max_depth=64, max_nodes=100_000, max_aliases=1000)
# tokenizer_config.json / chat_template.json can list many thousand added tokens.
TOKENIZER_LIMITS = Limits(max_bytes=256 << 20, max_depth=64, max_nodes=0, max_aliases=0)


def clip_text(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters (a 50 MB value must not make a 50 MB message)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_bounded(path: Path, max_bytes: int, encoding: str = "utf-8") -> str:
    """A file's text, refusing files over ``max_bytes`` before reading them.

    Raises ``OSError`` / ``UnicodeDecodeError`` as ``Path.read_text`` does.
    """
    size = path.stat().st_size
    if size > max_bytes:
        raise LimitError(f"file is {size} bytes, over the limit of {max_bytes}")
    return path.read_text(encoding=encoding)


def check_depth(doc: Any, max_depth: int) -> None:
    """Raise ``LimitError`` when lists/dicts nest deeper than ``max_depth`` (iterative walk)."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > max_depth:
            raise LimitError(f"nested deeper than {max_depth} levels")
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))


def load_json(
    text: str,
    limits: Limits,
    *,
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
    parse_constant: Callable[[str], Any] | None = None,
) -> Any:
    """``json.loads`` within ``limits``; raises ``json.JSONDecodeError``, ``ValueError`` from the
    hooks, or ``LimitError``."""
    if len(text) > limits.max_bytes:
        raise LimitError(
            f"document is {len(text)} characters, over the limit of {limits.max_bytes}"
        )
    try:
        doc = json.loads(text, object_pairs_hook=object_pairs_hook, parse_constant=parse_constant)
    except RecursionError:
        raise LimitError(f"nested deeper than {limits.max_depth} levels") from None
    check_depth(doc, limits.max_depth)
    return doc


def load_yaml(text: str, limits: Limits) -> Any:
    """``yaml.safe_load`` within ``limits``; raises ``yaml.YAMLError`` or ``LimitError``."""
    if len(text) > limits.max_bytes:
        raise LimitError(
            f"document is {len(text)} characters, over the limit of {limits.max_bytes}"
        )
    loader = _bounded_loader()(text, limits)
    try:
        return loader.get_single_data()
    except RecursionError:  # belt and braces: the depth cap should stop this first
        raise LimitError(f"nested deeper than {limits.max_depth} levels") from None
    finally:
        loader.dispose()


_LOADER: type | None = None


def _bounded_loader() -> type:
    """A SafeLoader that counts while composing (built on first use: yaml is imported lazily)."""
    global _LOADER
    if _LOADER is not None:
        return _LOADER
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        def __init__(self, stream: str, limits: Limits):
            super().__init__(stream)
            self._limits = limits
            self._depth = 0
            self._aliases = 0
            self._nodes = 0  # values composed so far, aliases counted at their expanded size
            self._open: set[str] = set()  # anchors whose node is still being composed
            self._sizes: dict[int, int] = {}  # id(anchored node) -> its expanded size

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent):
                self._aliases += 1
                if self._aliases > self._limits.max_aliases:
                    raise LimitError(f"more than {self._limits.max_aliases} YAML aliases")
                if event.anchor in self._open:
                    raise LimitError(f"YAML alias *{event.anchor} refers to itself")
                node = super().compose_node(parent, index)
                self._grow(self._sizes.get(id(node), 1))
                return node
            self._depth += 1
            if self._depth > self._limits.max_depth:
                raise LimitError(f"nested deeper than {self._limits.max_depth} levels")
            anchor = getattr(event, "anchor", None)
            if anchor is not None:
                self._open.add(anchor)
            start = self._nodes
            node = super().compose_node(parent, index)
            self._grow(1)
            if anchor is not None:
                self._open.discard(anchor)
                self._sizes[id(node)] = self._nodes - start
            self._depth -= 1
            return node

        def _grow(self, count: int) -> None:
            self._nodes += count
            if self._nodes > self._limits.max_nodes:
                raise LimitError(
                    f"more than {self._limits.max_nodes} values once YAML aliases are expanded"
                )

    _LOADER = BoundedLoader
    return _LOADER
