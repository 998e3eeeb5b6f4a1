"""Where a model folder's files may resolve: inside the folder, or an explicit root.

A model folder is untrusted input, symlinks included: every file it supplies and every file a
config names is opened only when its resolved path stays inside the folder (or the root a caller
widens it to, never the config itself). A bottom module, so every layer that opens a folder's
files (config, tokenizer, decoding, processors) uses this one check.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath, PureWindowsPath

from .errors import ConfigProblem, PathEscapeError

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
