"""Read a few node attributes straight from an ``.onnx`` file's protobuf wire format.

onnxruntime does not expose node attributes and the ``onnx`` package is not a runtime
dependency, so this walks the top-level graph's nodes itself (initializers are skipped by their
length, so a model with embedded weights costs no more than one without). Subgraphs are not read.
"""

from __future__ import annotations

import mmap
from pathlib import Path

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("malformed varint")


def _fields(buf: memoryview, start: int, end: int):
    """(field number, wire type, value) for each field; LEN values are (start, end) spans."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
        elif wire == _LEN:
            size, pos = _varint(buf, pos)
            value = (pos, pos + size)
            pos += size
        elif wire == _I64:
            value, pos = None, pos + 8
        elif wire == _I32:
            value, pos = None, pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > end:
            raise ValueError("truncated protobuf field")
        yield number, wire, value


def _text(buf: memoryview, span: tuple[int, int]) -> str:
    return bytes(buf[span[0] : span[1]]).decode("utf-8", "replace")


def int_attributes(path: Path, op_type: str, attribute: str) -> list[tuple[list[str], int]]:
    """For each top-level node of ``op_type``: its input names and the int ``attribute``
    (nodes without the attribute are left out). An unreadable file gives an empty list."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            buf = memoryview(mm)
            try:
                return _scan(buf, op_type.encode(), attribute)
            finally:
                buf.release()
    except (OSError, ValueError, IndexError):
        return []


def _scan(buf: memoryview, op_type: bytes, attribute: str) -> list[tuple[list[str], int]]:
    found = []
    for number, wire, graph in _fields(buf, 0, len(buf)):
        if number != 7 or wire != _LEN:  # ModelProto.graph
            continue
        for n, w, node in _fields(buf, *graph):
            if n != 1 or w != _LEN:  # GraphProto.node
                continue
            hit = _node(buf, node, op_type, attribute)
            if hit is not None:
                found.append(hit)
    return found


def _node(buf, span, op_type: bytes, attribute: str) -> tuple[list[str], int] | None:
    inputs, value, matches = [], None, False
    for n, w, v in _fields(buf, *span):
        if w != _LEN:
            continue
        if n == 1:  # NodeProto.input
            inputs.append(_text(buf, v))
        elif n == 4:  # NodeProto.op_type
            matches = bytes(buf[v[0] : v[1]]) == op_type
        elif n == 5:  # NodeProto.attribute
            name, ivalue = None, None
            for an, aw, av in _fields(buf, *v):
                if an == 1 and aw == _LEN:
                    name = _text(buf, av)
                elif an == 3 and aw == _VARINT:
                    ivalue = av - (1 << 64) if av >= 1 << 63 else av  # int64 two's complement
            if name == attribute and ivalue is not None:
                value = ivalue
    return (inputs, value) if matches and value is not None else None
