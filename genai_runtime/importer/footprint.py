"""What a model folder's weights cost: bits per weight and the bytes a decode step reads.

Counted from ``model.onnx``'s initializers (their shapes and types; the data is not read):

- a weight matrix is an initializer that ``MatMulNBits`` (its packed codes, scales and zero
  points), ``MatMul`` or ``Gemm`` reads, directly or through a ``Cast`` / ``Reshape`` (an fp16
  matrix cast at load, an embedding's codes reshaped for a lookup). Its weights are MatMulNBits'
  ``N * K``, or the float matrix's elements; a MatMul over ``*.offsets_t`` (the per-block
  offsets a GGUF ``Q4_K`` keeps exactly) adds bytes, not weights.
- a decode step reads every matrix once, and one row of each table a ``Gather`` /
  ``GatherBlockQuantized`` looks a token up in (a tied head reads the table whole, as a matrix).

The KV cache and the small vectors (norms, biases, rotary tables) are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnx import helper

MATRIX_OPS = ("MatMulNBits", "MatMul", "Gemm")
LOOKUP_OPS = ("Gather", "GatherBlockQuantized")
PASS_THROUGH = ("Cast", "Reshape")
OFFSETS_SUFFIX = ".offsets_t"


@dataclass(frozen=True)
class Footprint:
    weights: int  # weights in the matrices
    matrix_bytes: int  # their initializers' bytes (codes, scales, zero points, offsets)
    lookup_bytes: int  # one row of each looked-up table

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.matrix_bytes / self.weights if self.weights else 0.0

    @property
    def bytes_per_token(self) -> int:
        return self.matrix_bytes + self.lookup_bytes

    def describe(self) -> dict[str, Any]:
        return {
            "matrix_weights": self.weights,
            "bits_per_weight": round(self.bits_per_weight, 3),
            "weight_bytes_per_token_mib": round(self.bytes_per_token / 2**20, 1),
        }


def _nbytes(init: Any) -> int:
    count = 1
    for d in init.dims:
        count *= int(d)
    return count * helper.tensor_dtype_to_np_dtype(init.data_type).itemsize


def footprint(model_file: str | Path) -> Footprint:
    import onnx

    graph = onnx.load(str(model_file), load_external_data=False).graph
    inits = {i.name: i for i in graph.initializer}
    source = {name: name for name in inits}  # tensor -> the initializer it is (passed through)
    for node in graph.node:
        if node.op_type in PASS_THROUGH and node.input and node.input[0] in source:
            source[node.output[0]] = source[node.input[0]]
    matrices: set[str] = set()
    lookups: dict[str, int] = {}  # table initializer -> its rows
    weights = 0
    for node in graph.node:
        if node.op_type in MATRIX_OPS:
            names = [source[i] for i in node.input if i in source]
            matrices.update(names)
            if node.op_type == "MatMulNBits":
                attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
                weights += int(attrs["N"]) * int(attrs["K"])
            else:
                for n in names:
                    if not n.endswith(OFFSETS_SUFFIX) and len(inits[n].dims) == 2:
                        weights += int(inits[n].dims[0]) * int(inits[n].dims[1])
        elif node.op_type in LOOKUP_OPS and node.input and node.input[0] in source:
            table = source[node.input[0]]
            rows = int(inits[table].dims[0]) if inits[table].dims else 1
            lookups[table] = rows
            if node.op_type == "GatherBlockQuantized":  # its scales and zero points, by row too
                for extra in node.input[2:]:
                    if extra in source:
                        lookups[source[extra]] = rows
    matrix_bytes = sum(_nbytes(inits[n]) for n in matrices)
    lookup_bytes = sum(
        _nbytes(inits[n]) // max(rows, 1) for n, rows in lookups.items() if n not in matrices
    )
    return Footprint(weights, matrix_bytes, lookup_bytes)


def gguf_bytes_per_token(path: str | Path) -> int:
    """The bytes a llama.cpp decode step reads from a GGUF file's tensors, counted the same way:
    every 2-D tensor once, one row of the token embedding (whole when the head is tied to it,
    with no ``output.weight``); norms and other vectors left out."""
    from .gguf_file import read_gguf

    _, tensors = read_gguf(Path(path))
    total = 0
    for name, tensor in tensors.items():
        if len(tensor.shape) < 2:
            continue
        rows = tensor.data.shape[0]
        if name == "token_embd.weight" and "output.weight" in tensors:
            total += tensor.data.nbytes // max(rows, 1)  # one looked-up row
        else:
            total += tensor.data.nbytes
    return total
