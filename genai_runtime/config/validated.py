"""Remember configs that passed JSON-Schema validation, so loading one again skips jsonschema
(its import alone costs ~70 ms of every model load).

A config is remembered by the sha256 of its canonical JSON, its version and the schema file's
bytes: any change to the config or the schema is a new key and is validated again. Only a
successful validation writes a key, so an invalid config is always reported in full. The keys
are empty files under ``$GENAI_RUNTIME_VALIDATION_CACHE`` (``off`` disables it), else
``$XDG_CACHE_HOME/genai_runtime/validated``; failing to write one is never an error.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cache
from pathlib import Path
from typing import Any

ENV = "GENAI_RUNTIME_VALIDATION_CACHE"


def _root() -> Path | None:
    value = os.environ.get(ENV)
    if value == "off":
        return None
    if value:
        return Path(value).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "genai_runtime" / "validated"


@cache
def _schema_digest(schema_file: Path) -> bytes:
    return hashlib.sha256(schema_file.read_bytes()).digest()


def key(doc: Any, version: int, schema_file: Path) -> str | None:
    try:
        text = json.dumps(doc, sort_keys=True, ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError):  # not plain JSON (a YAML oddity): always validate
        return None
    h = hashlib.sha256(_schema_digest(schema_file))
    h.update(f"v{version}\0".encode())
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def known(digest: str | None) -> bool:
    root = _root()
    return bool(digest and root and (root / digest).is_file())


def remember(digest: str | None) -> None:
    root = _root()
    if not digest or root is None:
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / digest).touch()
    except OSError:
        pass  # a read-only home, a full disk: validation simply runs next time too
