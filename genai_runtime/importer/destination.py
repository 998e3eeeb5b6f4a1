"""Where an import may write. ``--force`` replaces only a folder an earlier import wrote.

OUT is user input like any other: ``import x.gguf ~ --force`` must not delete a home folder,
and OUT = the folder holding the GGUF (or the GGUF itself) must not destroy the input. A folder
an import wrote is recognised by its report file; nothing else is ever replaced.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import GenaiRuntimeError


def check_destination(gguf: Path, out: Path, *, force: bool, report_file: str) -> None:
    """Raise ``GenaiRuntimeError`` unless writing the import of ``gguf`` to ``out`` is safe."""
    source, target = gguf.resolve(), out.resolve()
    if target == source or target in source.parents:
        what = "is the input file" if target == source else f"holds the input {gguf}"
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
    if not (out / report_file).is_file():
        raise GenaiRuntimeError(
            f"{out} has no {report_file}, so no import wrote it; --force replaces only such a "
            "folder (choose another OUT_DIR, or remove this one yourself)"
        )
