"""Where an import may write. ``--force`` replaces only a folder an earlier import wrote.

OUT is user input like any other: ``import x.gguf ~ --force`` must not delete a home folder,
and OUT = the input (a GGUF file or a Hugging Face folder) or a folder holding it must not
destroy the input. A folder an import wrote is recognised by its report file; nothing else is
ever replaced.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import GenaiRuntimeError


def check_destination(source: Path, out: Path, *, force: bool, reports: tuple[str, ...]) -> None:
    """Raise ``GenaiRuntimeError`` unless writing the import of ``source`` (a GGUF file or a
    Hugging Face folder) to ``out`` is safe; ``reports``: the report file names an import writes."""
    given, target = source, out.resolve()
    source = source.resolve()
    if target == source or target in source.parents:
        what = "is the input" if target == source else f"holds the input {given}"
        raise GenaiRuntimeError(f"{out} {what}; import into a folder of its own")
    if not os.path.lexists(out):
        return
    if not force:
        raise GenaiRuntimeError(f"{out} already exists; pass --force to replace it")
    if out.is_symlink() or not out.is_dir():
        kind = "a symbolic link" if out.is_symlink() else "not a folder"
        raise GenaiRuntimeError(
            f"{out} is {kind}; --force replaces only a model folder an earlier import wrote"
        )
    if not any((out / name).is_file() for name in reports):
        raise GenaiRuntimeError(
            f"{out} has no {reports[0]}, so no import wrote it; --force replaces only such a "
            "folder (choose another OUT_DIR, or remove this one yourself)"
        )
