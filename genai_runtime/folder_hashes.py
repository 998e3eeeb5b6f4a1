"""The file hashes an import records in its model folder, and checking a folder against them.

An import (``genai-runtime import`` / ``pull``) writes every file's size, modification time and
sha256 into its report file. The quick check compares sizes and modification times and hashes
only the files whose size or time changed; the full check hashes every file. A file whose bytes
differ from the record (a damaged disk, an interrupted copy, an edit) is named, so a corrupted
model is refused instead of running as garbage. Folders without a record are not checked.
Settings files (JSON, Jinja) are what people edit by hand, so a lenient check reports an edited
one as a note and refuses only changed weights, graphs and missing files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from .config.bounded import CONFIG_LIMITS, LimitError, clip_text, load_json, read_bounded
from .errors import ModelError
from .folder_paths import path_problem

REPORT_FILE = "import.json"  # written by importer/folder.py
OLD_REPORT_FILE = "gguf_import.json"  # its name before Hugging Face folders could be imported
RECORD_KEY = "files"
_CHUNK = 1 << 20
SETTINGS_SUFFIXES = (".json", ".jinja")  # hand-editable files a lenient check only notes


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def record_files(folder: Path, report: str = REPORT_FILE) -> None:
    """Add every other file of ``folder`` (size, mtime, sha256) to its report file."""
    path = folder / report
    doc = json.loads(path.read_text(encoding="utf-8"))
    files = {}
    for file in sorted(folder.iterdir()):
        if file.name != report and file.is_file():
            stat = file.stat()
            files[file.name] = {
                "bytes": stat.st_size,
                "mtime_ns": stat.st_mtime_ns,
                "sha256": sha256_file(file),
            }
    doc[RECORD_KEY] = files
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def changed_files(folder: Path, *, full: bool = False, report: str = REPORT_FILE) -> list[str]:
    """What differs from the recorded hashes, one line per file (empty: intact or no record).

    ``full``: hash every file; otherwise only those whose size or modification time changed.
    """
    record = _record(folder, report)
    problems = []
    for name, want in record.items():
        shown = clip_text(name, 80)
        if path_problem(folder, name, None, f"{report}: {RECORD_KEY}"):
            problems.append(f"{shown}: not a file of this folder")
            continue
        file = folder / name
        if not file.is_file():
            problems.append(f"{shown}: missing")
            continue
        stat = file.stat()
        if stat.st_size != want["bytes"]:
            problems.append(f"{shown}: {stat.st_size} bytes, {want['bytes']} recorded")
        elif full or stat.st_mtime_ns != want["mtime_ns"]:
            got = sha256_file(file)
            if got != want["sha256"]:
                problems.append(f"{shown}: sha256 {got}, {want['sha256']} recorded")
    return problems


def verify_folder(
    folder: str | Path,
    *,
    full: bool = False,
    report: str = REPORT_FILE,
    lenient: bool = False,
) -> list[str]:
    """``ModelError`` naming every file that no longer matches the import's record.

    ``lenient``: an edited settings file (JSON, Jinja) is returned as a note instead of refused.
    """
    folder = Path(folder)
    problems = changed_files(folder, full=full, report=report)
    notes = [p for p in problems if lenient and _edited_settings(p)]
    problems = [p for p in problems if p not in notes]
    if problems:
        raise ModelError(
            f"{folder} changed since it was imported ({len(problems)} file"
            f"{'s' * (len(problems) != 1)}): "
            + "; ".join(problems[:8])
            + ". Pull it again (genai-runtime pull NAME re-imports it), or import the GGUF "
            "again with --force"
        )
    return [f"{folder}: {note} (edited since the import)" for note in notes]


def recorded_hashes(folder: str | Path, report: str = REPORT_FILE) -> dict[str, str]:
    """The sha256 the import recorded for each file of ``folder`` (empty: no record)."""
    return {name: entry["sha256"] for name, entry in _record(Path(folder), report).items()}


def _edited_settings(problem: str) -> bool:
    name, _, what = problem.partition(": ")
    return name.endswith(SETTINGS_SUFFIXES) and what not in ("missing", "not a file of this folder")


def _record(folder: Path, report: str) -> dict[str, dict[str, Any]]:
    path = folder / report
    if not path.is_file():
        return {}
    try:
        doc = load_json(read_bounded(path, CONFIG_LIMITS.max_bytes), CONFIG_LIMITS)
    except (OSError, UnicodeDecodeError, ValueError, LimitError) as exc:
        raise ModelError(f"{path}: cannot read the import record: {clip_text(str(exc))}") from None
    files = doc.get(RECORD_KEY, {}) if isinstance(doc, dict) else None
    if not isinstance(files, dict) or not all(_entry_ok(v) for v in files.values()):
        raise ModelError(
            f"{path}: {RECORD_KEY!r} must map file names to {{bytes, mtime_ns, sha256}}"
        )
    return files


def _entry_ok(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and all(isinstance(entry.get(k), int) for k in ("bytes", "mtime_ns"))
        and isinstance(entry.get("sha256"), str)
    )
