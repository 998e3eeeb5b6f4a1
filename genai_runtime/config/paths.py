"""A model folder is untrusted input: every file a config names must stay inside it.

``root`` defaults to the model folder; a caller may widen it explicitly (e.g. to a parent that
holds a target and a draft model side by side), never the config itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from ..errors import ConfigProblem, PathEscapeError

_FILE_KEYS = ("filename", "file")
# Keys whose value is native code to load: allowed only with the caller's trust flag.
CODE_KEYS = ("custom_ops_library", "library")
_MAX_NAME_CHARS = 200  # longer names are quoted cut short in messages


def folder_file(model_dir: Path, name: str, root: Path | None = None) -> Path:
    """``model_dir / name``, a file the folder supplies, to open: refused (``PathEscapeError``)
    when its resolved path (symlinks followed) leaves ``root`` (default: the folder itself)."""
    resolve_inside(model_dir, name, root, name)
    return model_dir / name


def resolve_inside(model_dir: Path, name: str, root: Path | None, where: str) -> Path:
    """``model_dir / name`` if it stays inside ``root``; else a PathEscapeError naming ``where``."""
    problem = path_problem(model_dir, name, root, where)
    if problem:
        raise PathEscapeError([problem])
    return (model_dir / name).resolve()


def path_problem(model_dir: Path, name: str, root: Path | None, where: str) -> ConfigProblem | None:
    if not name:
        return ConfigProblem(where, "expected a file name, got an empty string")
    shown = repr(name) if len(name) <= _MAX_NAME_CHARS else repr(name[:_MAX_NAME_CHARS]) + "..."
    if len(name) > _MAX_NAME_CHARS * 20 or "\x00" in name:
        return ConfigProblem(where, f"expected a usable file name, got {shown} ({len(name)} chars)")
    if PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute():
        return ConfigProblem(where, f"absolute paths are not allowed, got {shown}")
    base = (root or model_dir).resolve()
    target = (model_dir / name).resolve()
    if target != base and base not in target.parents:
        return ConfigProblem(
            where,
            f"{shown} resolves to {target}, outside the model folder {base} "
            "(pass an explicit root to allow sibling folders)",
        )
    return None


def file_entries(doc: Any, path: str = "") -> Iterator[tuple[str, str, str]]:
    """Every (json_path, key, value) under ``doc`` whose key names a file or code library."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            here = f"{path}.{key}" if path else key
            if key in _FILE_KEYS + CODE_KEYS and isinstance(value, str):
                yield here, key, value
            else:
                yield from file_entries(value, here)
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from file_entries(value, f"{path}[{i}]")


def check_paths(doc: dict[str, Any], model_dir: Path, root: Path | None) -> list[ConfigProblem]:
    """Problems for every file name in a raw document (v1 or v2) that escapes ``root``."""
    problems = []
    body = {k: v for k, v in doc.items() if k != "metadata"}  # free-form, never opened
    for where, _key, value in file_entries(body):
        problem = path_problem(model_dir, value, root, where)
        if problem:
            problems.append(problem)
    return problems
