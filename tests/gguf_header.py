"""A GGUF file's header as plain Python values, and the bytes of a file with an edited header.

Written independently of ``genai_runtime.importer`` (from the GGUF format: magic, version,
counts, typed key/values, tensor infos, aligned data) so the hostile-header tests and the fuzz
target can change one field of a valid tiny file at a time.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q"}
SCALARS |= {11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
UINT32, INT32, FLOAT32, BOOL, UINT64 = 4, 5, 6, 7, 10


@dataclass(frozen=True)
class RawItems:
    """An array's items already encoded (fast to write when there are millions)."""

    count: int
    data: bytes


@dataclass
class Header:
    version: int
    kv: dict[str, tuple[int, Any]]  # key -> (GGUF value type, value); arrays: (item type, list)
    tensors: list[list[Any]]  # [name, dims, GGML type, offset]
    data: bytes  # the tensor data, from the first aligned byte
    n_tensors: int | None = None  # None: len(tensors); set to lie about the count
    n_kv: int | None = None
    extra: bytes = field(default=b"")  # raw bytes written after the header, before padding


class _Reader:
    def __init__(self, raw: bytes):
        self.raw, self.pos = raw, 0

    def unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.raw, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        self.pos += n
        return self.raw[self.pos - n : self.pos].decode("utf-8")

    def value(self, kind: int) -> Any:
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            return (item, [self.value(item) for _ in range(count)])
        return self.unpack(SCALARS[kind])


def parse(raw: bytes) -> Header:
    r = _Reader(raw)
    assert raw[:4] == b"GGUF"
    r.pos = 4
    version = r.unpack("<I")
    n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
    kv = {}
    for _ in range(n_kv):
        key = r.string()
        kind = r.unpack("<I")
        kv[key] = (kind, r.value(kind))
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.unpack("<Q") for _ in range(r.unpack("<I"))]
        tensors.append([name, dims, r.unpack("<I"), r.unpack("<Q")])
    align = kv.get("general.alignment", (UINT32, 32))[1]
    start = -(-r.pos // align) * align
    return Header(version, kv, tensors, raw[start:])


def _string(text: str | bytes) -> bytes:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def _value(kind: int, value: Any) -> bytes:
    if kind == STRING:
        return _string(value)
    if kind == ARRAY:
        item, items = value
        if isinstance(items, RawItems):
            return struct.pack("<IQ", item, items.count) + items.data
        return struct.pack("<IQ", item, len(items)) + b"".join(_value(item, v) for v in items)
    return struct.pack(SCALARS[kind], value)


def emit(h: Header, align: int = 32) -> bytes:
    """The file's bytes; the data starts at the next multiple of ``align`` (the writer's own,
    whatever ``general.alignment`` now claims)."""
    out = bytearray(b"GGUF" + struct.pack("<I", h.version))
    n_tensors = len(h.tensors) if h.n_tensors is None else h.n_tensors
    n_kv = len(h.kv) if h.n_kv is None else h.n_kv
    out += struct.pack("<QQ", n_tensors, n_kv)
    for key, (kind, value) in h.kv.items():
        out += _string(key) + struct.pack("<I", kind) + _value(kind, value)
    for name, dims, ttype, offset in h.tensors:
        out += _string(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ttype, offset)
    out += h.extra
    out += bytes(-len(out) % align)
    return bytes(out + h.data)
