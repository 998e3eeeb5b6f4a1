"""``og.Images`` / ``og.Audios``: media handed to a processor (images read up front, audio
files when processed)."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import GenerationError

MAX_MEDIA_BYTES = 512 * 1024 * 1024


def _read(paths: tuple[str | os.PathLike, ...], kind: str) -> list[tuple[str, bytes]]:
    return [(name, path.read_bytes()) for name, path in _check(paths, kind)]


def _check(paths: tuple[str | os.PathLike, ...], kind: str) -> list[tuple[str, Path]]:
    if not paths:
        raise GenerationError(f"og.{kind}.open: no files given")
    out = []
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise GenerationError(f"og.{kind}.open: file not found: {p}")
        if p.stat().st_size > MAX_MEDIA_BYTES:
            raise GenerationError(f"og.{kind}.open: {p} is larger than {MAX_MEDIA_BYTES} bytes")
        out.append((str(p), p))
    return out


class Audios:
    """Audio clips: files are read when processed, a block at a time (``audio.stream``)."""

    def __init__(self, items: list[tuple[str, bytes | Path]]):
        self.items = items

    @classmethod
    def open(cls, *paths: str | os.PathLike) -> Audios:
        return cls(_check(paths, "Audios"))

    @classmethod
    def open_bytes(cls, *blobs: bytes) -> Audios:
        if not blobs:
            raise GenerationError("og.Audios.open_bytes: no audio given")
        return cls([(f"<bytes {i}>", bytes(b)) for i, b in enumerate(blobs)])

    def __len__(self) -> int:
        return len(self.items)


class Images:
    def __init__(self, items: list[tuple[str, bytes]]):
        self.items = items

    @classmethod
    def open(cls, *paths: str | os.PathLike) -> Images:
        return cls(_read(paths, "Images"))

    @classmethod
    def open_bytes(cls, *blobs: bytes) -> Images:
        if not blobs:
            raise GenerationError("og.Images.open_bytes: no image given")
        return cls([(f"<bytes {i}>", bytes(b)) for i, b in enumerate(blobs)])

    def __len__(self) -> int:
        return len(self.items)
