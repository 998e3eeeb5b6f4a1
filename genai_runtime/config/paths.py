"""A model folder is untrusted input: every file a config names must stay inside it.

``root`` defaults to the model folder; a caller may widen it explicitly (e.g. to a parent that
holds a target and a draft model side by side), never the config itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ConfigProblem
from ..folder_paths import folder_file, path_problem, resolve_inside

__all__ = [
    "CODE_KEYS",
    "check_paths",
    "file_entries",
    "folder_file",
    "path_problem",
    "resolve_inside",
]

_FILE_KEYS = ("filename", "file")
# Keys whose value is native code to load: allowed only with the caller's trust flag.
CODE_KEYS = ("custom_ops_library", "library")


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
