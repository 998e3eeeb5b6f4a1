"""Tensors of a ``.safetensors`` file as NumPy memory maps (no torch).

The ``safetensors`` package opens and checks each file first (header, offsets, that the data
covers the file: a truncated file fails there). Its NumPy API cannot return bfloat16, the dtype
of most released checkpoints, so the bytes are then read through a read-only ``np.memmap`` at
the offsets the header states: one tensor in memory at a time, widened to fp32 on demand.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config.bounded import CONFIG_LIMITS, LimitError, load_json
from ..errors import ModelError, UnsupportedError
from .hf_checks import present

MAX_HEADER = 100 << 20  # the format's own limit on the JSON header
# safetensors dtype -> NumPy dtype of the stored bytes (BF16: the top half of an fp32).
DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "F64": np.dtype("<f8"),
}


@dataclass(frozen=True)
class Entry:
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute file offsets
    end: int


class SafetensorsFile:
    """One ``.safetensors`` file: names, dtypes and shapes from its header; data on demand."""

    def __init__(self, path: Path):
        self.path = path
        if not present(path):  # a FIFO would block safe_open; refused before it is opened
            raise ModelError(f"{path}: no such file")
        try:
            from safetensors import safe_open
        except ImportError as exc:
            raise UnsupportedError(
                "importing safetensors needs the 'gguf' extra: pip install 'genai_runtime[gguf]'"
            ) from exc
        try:
            with safe_open(str(path), framework="numpy"):
                pass
        except Exception as exc:  # SafetensorError and OSError: a file we cannot use
            raise ModelError(f"{path}: not a readable safetensors file ({exc})") from exc
        self.entries = self._header()
        self._map: np.memmap | None = None

    def _header(self) -> dict[str, Entry]:
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > min(MAX_HEADER, size - 8):
                raise ModelError(f"{self.path}: safetensors header of {n} bytes does not fit")
            raw = f.read(n)
        try:
            doc = load_json(raw.decode("utf-8"), CONFIG_LIMITS)
        except (ValueError, LimitError) as exc:  # UnicodeDecodeError too
            raise ModelError(f"{self.path}: unreadable safetensors header ({exc})") from exc
        entries = {}
        try:
            for name, info in doc.items():
                if name == "__metadata__":
                    continue
                begin, end = (int(v) for v in info["data_offsets"])
                shape = tuple(int(d) for d in info["shape"])
                entries[name] = Entry(str(info["dtype"]), shape, 8 + n + begin, 8 + n + end)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ModelError(f"{self.path}: unreadable safetensors header ({exc!r})") from exc
        return entries

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` as fp32 (a copy; the file stays mapped read-only)."""
        e = self.entries[name]
        stored = DTYPES.get(e.dtype)
        if stored is None:
            raise UnsupportedError(
                f"{self.path}: tensor {name!r} has dtype {e.dtype}; supported: {', '.join(DTYPES)}"
            )
        count = int(np.prod(e.shape, dtype=np.int64))
        if e.end - e.begin != count * stored.itemsize:
            raise ModelError(
                f"{self.path}: tensor {name!r} holds {e.end - e.begin} bytes, but its shape "
                f"{list(e.shape)} and dtype {e.dtype} need {count * stored.itemsize}"
            )
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        raw = self._map[e.begin : e.end].view(stored).reshape(e.shape)
        if e.dtype == "BF16":
            return (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.astype(np.float32)
