"""A second session over a decoder graph that scores several new tokens per row of a batch.

onnxruntime's CPU ``GroupQueryAttention`` refuses a pass with several new tokens per row and a
past when the batch has more than one row ("batch_size must be 1 when sequence_length > 1 and
past context is given"), and a batched server verifies drafts for every row at once. This
rewrite runs each attention node once per row instead: a ``Scan`` over the batch whose body is
the same node at batch 1 (the pass a ``Generator`` verifies drafts with), so each row's
attention is the kernel's own; everything else (the MatMuls, the lm_head) still sees the whole
batch in one call.

The rewritten graph returns, per layer, only the new tokens' keys/values
``present.*`` ``[B, kv_heads, S, head_size]``, which the caller writes into its share buffer at
each row's length. Only ``GroupQueryAttention`` with a share-buffer past is rewritten; a graph
without one gives None. The weights stay in their files (the session reads them beside the
model), so a verify session costs a second copy of the weights in memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnxruntime as ort

from ..errors import UnsupportedError
from ..spec import SessionSpec
from .sessions import create_session

_OP, _DOMAIN = "GroupQueryAttention", "com.microsoft"
_INT32, _INT64 = 6, 7  # onnx TensorProto data types


def rows_model_bytes(path: Path) -> tuple[bytes, list[str]] | None:
    """The rewritten model and the names of the outputs that now hold only the new tokens'
    keys/values; None when the graph has no ``GroupQueryAttention`` to rewrite."""
    try:
        import onnx
    except ImportError as exc:
        raise UnsupportedError(
            "verifying drafts in a batch edits the decoder graph with the onnx package: "
            "pip install onnx"
        ) from exc
    model = onnx.load(str(path), load_external_data=False)  # weights stay in their files
    graph = model.graph
    past = [i for i in graph.input if i.name not in {n.name for n in graph.initializer}]
    elem = next((i.type.tensor_type.elem_type for i in past if "past" in i.name), None)
    nodes, new_rows = [], []
    for node in graph.node:
        if node.op_type != _OP or node.domain != _DOMAIN:
            nodes.append(node)
            continue
        if elem is None or len(node.input) < 7:
            return None
        nodes.append(_per_row(onnx, node, elem))
        new_rows += [node.output[1], node.output[2]]
    if not new_rows:
        return None
    del graph.node[:]
    graph.node.extend(nodes)
    for output in graph.output:
        if output.name in new_rows:
            output.type.tensor_type.ClearField("shape")
    return model.SerializeToString(), new_rows


def _per_row(onnx: Any, node: Any, elem: int) -> Any:
    """A Scan over the batch running ``node`` on one row at a time: inputs query (packed or
    not), key, value, past key/value and seqlens_k are sliced per row; the total length and
    the rotary tables are read from the outer graph. Outputs: the attention output and the
    row's new keys/values (positions seqlens_k + 1 - S .. seqlens_k)."""
    helper = onnx.helper
    inputs = list(node.input)
    query, key, value, past_k, past_v, seqlens = inputs[:6]
    shared = inputs[6:]  # total_sequence_length, cos/sin caches, and any later optional input
    tag = node.name or node.output[0]

    def at(name: str) -> str:
        return f"{tag}/rows/{name}"

    sliced = [("q", query)] + ([("k", key), ("v", value)] if key else [])
    sliced += [("pk", past_k), ("pv", past_v), ("len", seqlens)]
    body = [
        helper.make_node("Constant", [], [at("axis0")], value=_ints(helper, "axis0", [0])),
        helper.make_node("Constant", [], [at("axis2")], value=_ints(helper, "axis2", [2])),
        helper.make_node("Constant", [], [at("one")], value=_ints(helper, "one", [1])),
    ]
    one_row = {}
    for short, _ in sliced:
        one_row[short] = at(f"{short}1")
        body.append(helper.make_node("Unsqueeze", [at(short), at("axis0")], [one_row[short]]))
    attention = helper.make_node(
        _OP,
        [one_row["q"], one_row.get("k", ""), one_row.get("v", ""), one_row["pk"], one_row["pv"],
         one_row["len"], *shared],
        [at("out1"), at("present_k"), at("present_v")],
        domain=_DOMAIN, name=node.name,
    )  # fmt: skip
    attention.attribute.extend(node.attribute)
    body += [
        attention,
        helper.make_node("Squeeze", [at("out1"), at("axis0")], [at("out")]),
        # the row's new tokens sit at seqlens_k + 1 - S .. seqlens_k of its present buffer
        helper.make_node("Shape", [at("q")], [at("width")], start=0, end=1),
        helper.make_node("Cast", [one_row["len"]], [at("len64")], to=_INT64),
        helper.make_node("Add", [at("len64"), at("one")], [at("end")]),
        helper.make_node("Sub", [at("end"), at("width")], [at("start")]),
    ]
    for short in ("k", "v"):
        cut = at(f"new_{short}1")
        body += [
            helper.make_node(
                "Slice", [at(f"present_{short}"), at("start"), at("end"), at("axis2")], [cut]
            ),
            helper.make_node("Squeeze", [cut, at("axis0")], [at(f"new_{short}")]),
        ]
    graph = helper.make_graph(
        body,
        f"{tag}/rows",
        [_info(helper, at(s), _INT32 if s == "len" else elem) for s, _ in sliced],
        [_info(helper, at(s), elem) for s in ("out", "new_k", "new_v")],
    )
    return helper.make_node(
        "Scan",
        [name for _, name in sliced],
        list(node.output[:3]),
        name=f"{tag}/rows",
        num_scan_inputs=len(sliced),
        body=graph,
    )


def _info(helper: Any, name: str, elem: int) -> Any:
    return helper.make_tensor_value_info(name, elem, None)


def _ints(helper: Any, name: str, values: list[int]) -> Any:
    return helper.make_tensor(name, _INT64, [len(values)], values)


def verify_session(
    spec: SessionSpec, path: Path, model_dir: Path
) -> tuple[ort.InferenceSession, list[str]]:
    """A session over the rewritten decoder ``path`` with the stage's own session options (it
    takes turns with the decoder's own session, so its threads stop spinning after a run), and
    the outputs that hold only the new tokens' keys/values."""
    rewritten = rows_model_bytes(path)
    if rewritten is None:
        raise UnsupportedError(
            f"{path.name} has no GroupQueryAttention to run per row; batched verification "
            "needs the share-buffer decoder shape"
        )
    data, new_rows = rewritten
    return create_session(spec, path, model_dir, turns=True, model_bytes=data), new_rows
