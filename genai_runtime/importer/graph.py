"""What every decoder graph is written with: initializers streamed to one external-data file,
a node/initializer collector, the shared inputs/outputs, and the model file.

Weights stream one by one into ``model.onnx.data`` so peak memory stays near one tensor, not the
whole model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..session.graph_io import LAST_POSITION_SWITCH

IR_VERSION = 10  # onnxruntime 1.31 refuses the IR 14 that onnx 1.23 stamps by default
OPSET = 21
STATIC_OPSET, STATIC_IR_VERSION = 24, 11  # TensorScatter and Attention's nonpad_kv_seqlen
DATA_FILE = "model.onnx.data"
_ALIGN = 64


@dataclass
class ExternalData:
    """Appends initializers to one external-data file as they are made (no handle kept open,
    so a failed build leaves nothing to close)."""

    path: Path
    offset: int = 0

    def __post_init__(self) -> None:
        self.path.write_bytes(b"")

    def tensor(self, name: str, array: np.ndarray) -> Any:
        from onnx import TensorProto, helper

        array = np.ascontiguousarray(array)
        pad = (-self.offset) % _ALIGN
        # Written from the array's own buffer: no bytes copy of a large table.
        raw = memoryview(array.reshape(-1)).cast("B")
        with open(self.path, "ab") as f:
            f.write(b"\0" * pad)
            f.write(raw)
        self.offset += pad
        proto = TensorProto()
        proto.name = name
        proto.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        proto.dims.extend(array.shape)
        proto.data_location = TensorProto.EXTERNAL
        for key, value in (
            ("location", self.path.name),
            ("offset", str(self.offset)),
            ("length", str(len(raw))),
        ):
            entry = proto.external_data.add()
            entry.key, entry.value = key, value
        self.offset += len(raw)
        return proto


@dataclass
class GraphBuilder:
    """Collects nodes and initializers; names are unique by construction (prefix + counter)."""

    data: ExternalData
    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    _count: int = 0
    _consts: set = field(default_factory=set)

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, domain: str = "", **attrs):
        from onnx import helper

        self._count += 1
        name = f"/{op_type}_{self._count}"
        outs = [f"{name}/output_{i}" for i in range(n_out)]
        node = helper.make_node(op_type, inputs, outs, name=name, domain=domain, **attrs)
        self.nodes.append(node)
        return outs[0] if n_out == 1 else outs

    def const(self, name: str, array: np.ndarray) -> str:
        from onnx import numpy_helper

        if name in self._consts:
            return name
        self._consts.add(name)
        if array.nbytes >= 1024:
            self.initializers.append(self.data.tensor(name, array))
        else:
            self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name


@dataclass(frozen=True)
class BuildReport:
    """What the build did with each weight: MatMulNBits blocks, or float; and how (e.g.
    "int8 from Q5_0 (exact)", "int4 RTN from BF16", "fp32 from Q6_K")."""

    nbits: tuple[str, ...]
    dequantised: tuple[str, ...]
    formats: tuple[tuple[str, str], ...] = ()


def save_model(
    g: GraphBuilder, inputs: list, outputs: list, out_dir: Path, opset: int, ir_version: int
) -> None:
    from onnx import helper

    graph = helper.make_graph(g.nodes, "decoder", inputs, outputs, g.initializers)
    onnx_model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)],
        producer_name="genai_runtime.importer",
    )
    onnx_model.ir_version = ir_version
    (out_dir / "model.onnx").write_bytes(onnx_model.SerializeToString())


def decoder_io(vocab: int) -> tuple[list, list]:
    """The inputs and outputs every decoder graph starts from: ``input_ids``, ``logits``."""
    from onnx import TensorProto, helper

    ids = ["batch_size", "seq_len"]
    logits = ["batch_size", "seq_len", vocab]
    return (
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ids)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, logits)],
    )


def last_position_switch(g: GraphBuilder, inputs: list, hidden: str) -> str:
    """``hidden`` [B, S, H] as it enters the lm_head, or, when the graph's
    ``LAST_POSITION_SWITCH`` input is fed true, each row's last real position [B, 1, H].

    Batches are right-padded, so a row's last real token in the current chunk (the mask's last
    S columns) is at its mask count - 1; a row with none picks -1, the chunk's last column. With
    the switch false (its default) the rows pass through in order and the logits are [B, S, V].
    """
    from onnx import TensorProto, helper, numpy_helper

    inputs.append(helper.make_tensor_value_info(LAST_POSITION_SWITCH, TensorProto.BOOL, []))
    g.initializers.append(numpy_helper.from_array(np.array(False), LAST_POSITION_SWITCH))
    p = "/last_position"
    zero = g.const(p + "/zero", np.array([0], np.int64))
    one = g.const(p + "/one", np.array([1], np.int64))
    two = g.const(p + "/two", np.array([2], np.int64))
    three = g.const(p + "/three", np.array([3], np.int64))
    end = g.const(p + "/end", np.array([2**62], np.int64))
    shape = g.op("Shape", [hidden])
    s = g.op("Slice", [shape, one, two])
    h = g.op("Slice", [shape, two, three])
    chunk_mask = g.op("Slice", ["attention_mask", g.op("Neg", [s]), end, one])
    count = g.op("ReduceSum", [g.op("Cast", [chunk_mask], to=TensorProto.INT64), one], keepdims=1)
    first = g.op("Where", [LAST_POSITION_SWITCH, g.op("Sub", [count, one]), zero])  # [B, 1]
    rows = g.op("Where", [LAST_POSITION_SWITCH, one, s])  # [1]: 1, or S
    steps = g.op("Range", [g.const(p + "/zero0", np.array(0, np.int64)),
                           g.op("Squeeze", [rows, zero]),
                           g.const(p + "/one0", np.array(1, np.int64))])  # fmt: skip
    index = g.op("Add", [first, g.op("Unsqueeze", [steps, zero])])  # [B, R]
    index = g.op("Unsqueeze", [index, two])  # [B, R, 1]
    index = g.op("Expand", [index, g.op("Concat", [one, one, h], axis=0)])  # [B, R, H]
    return g.op("GatherElements", [hidden, index], axis=1)
