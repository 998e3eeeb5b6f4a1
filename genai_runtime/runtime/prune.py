"""Opt-in graph rewrite: compute the prompt pass's logits only at each row's last real token.

A decoder graph's lm_head turns every position's hidden state into logits, ``[B, S, V]``, but
generation reads one row per sequence. With ``"genai_runtime.prune_prompt_logits": "1"`` in a
session's ``session_options``, the graph is edited in memory before the session is created: the
hidden state entering the lm_head is first reduced to each row's last real position, so the
lm_head runs on ``[B, 1, H]`` and the graph declares ``logits`` as ``[B, 1, V]`` (the shape the
builder's ``prune_lm_head`` exports have, which the executor already reads).

The last real position comes from the graph's own ``attention_mask``: batches are right-padded,
so within the current chunk (the mask's last S columns) a row's real tokens are the ones with
mask 1, and its last one is at ``count - 1``. Decode passes (S = 1) pick position 0, as before.

Routed by structure only: the node producing ``logits`` must be a ``MatMul`` whose weight is an
fp32 initializer, or a ``MatMulNBits`` (int4 lm_head) with its weight stored in the graph, fed a
rank-3 hidden state, and the graph must take ``attention_mask``. Anything else is left as it is.
Each output row depends on its own input row only; measured on SmolLM2-135M fp32 and int4 on an
AMD EPYC, the pruned pass's logits equal the full pass's last rows exactly (max |diff| 0.0, batch
of three right-padded prompts included), and tests/integration/test_prune_prompt_logits.py
checks this against the unpruned graph wherever it runs.

Not the default because ``get_output("logits")`` after a prompt pass then holds the last row
only (onnxruntime-genai returns the whole ``[B, S, V]``), and the edit needs ``onnx``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ModelError, UnsupportedError

SETTING = "genai_runtime.prune_prompt_logits"
_PREFIX = "/genai_runtime/prune_prompt_logits"
_FLOAT = 1  # onnx TensorProto.FLOAT


def wanted(config_entries: dict[str, str]) -> bool:
    value = config_entries.get(SETTING, "0")
    if value not in ("0", "1"):
        raise ModelError(f'session_options["{SETTING}"]: expected "0" or "1", got {value!r}')
    return value == "1"


def pruned_model_bytes(path: Path, logits: str, mask: str) -> bytes | None:
    """The rewritten model (weights left external), or None when the graph does not fit."""
    try:
        import onnx
        from onnx import TensorProto, helper
    except ImportError as exc:
        raise UnsupportedError(
            f"{SETTING} edits the graph with the onnx package: pip install onnx"
        ) from exc
    model = onnx.load(str(path), load_external_data=False)  # weights stay in their files
    graph = model.graph
    lm_head = _lm_head(graph, logits, mask)
    if lm_head is None:
        return None
    hidden = lm_head.input[0]
    p = _PREFIX
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    graph.initializer.extend(
        [
            helper.make_tensor(f"{p}/one", TensorProto.INT64, [1], [1]),
            helper.make_tensor(f"{p}/two", TensorProto.INT64, [1], [2]),
            helper.make_tensor(f"{p}/three", TensorProto.INT64, [1], [3]),
            helper.make_tensor(f"{p}/end", TensorProto.INT64, [1], [2**62]),
            helper.make_tensor(f"{p}/unit", TensorProto.INT64, [], [1]),
        ]
    )

    def axis_one(op: str, source: str, out: str, **attrs: Any) -> Any:
        # ReduceSum and Unsqueeze take their axes as an input from opset 13, before as attribute.
        if opset >= 13:
            return helper.make_node(op, [source, f"{p}/one"], [out], **attrs)
        return helper.make_node(op, [source], [out], axes=[1], **attrs)

    nodes = [
        # S = hidden.shape[1]; the current chunk is the mask's last S columns.
        helper.make_node("Shape", [hidden], [f"{p}/shape"]),
        helper.make_node("Slice", [f"{p}/shape", f"{p}/one", f"{p}/two"], [f"{p}/s"]),
        helper.make_node("Slice", [f"{p}/shape", f"{p}/two", f"{p}/three"], [f"{p}/h"]),
        helper.make_node("Neg", [f"{p}/s"], [f"{p}/minus_s"]),
        helper.make_node(
            "Slice", [mask, f"{p}/minus_s", f"{p}/end", f"{p}/one"], [f"{p}/chunk_mask"]
        ),
        helper.make_node("Cast", [f"{p}/chunk_mask"], [f"{p}/chunk_mask64"], to=TensorProto.INT64),
        axis_one("ReduceSum", f"{p}/chunk_mask64", f"{p}/count", keepdims=1),
        # [B, 1]: each row's last real position in the chunk. Every row has one (a finished row
        # is fed pad tokens with mask 1); if not, -1 is a valid index (the chunk's last column).
        helper.make_node("Sub", [f"{p}/count", f"{p}/unit"], [f"{p}/last"]),
        # GatherElements (opset 11) wants indices of the data's rank: [B, 1, 1] -> [B, 1, H].
        axis_one("Unsqueeze", f"{p}/last", f"{p}/last3"),
        helper.make_node(
            "Concat", [f"{p}/one", f"{p}/one", f"{p}/h"], [f"{p}/index_shape"], axis=0
        ),
        helper.make_node("Expand", [f"{p}/last3", f"{p}/index_shape"], [f"{p}/index"]),
        helper.make_node("GatherElements", [hidden, f"{p}/index"], [f"{p}/hidden_last"], axis=1),
    ]
    lm_head.input[0] = f"{p}/hidden_last"
    at = list(graph.node).index(lm_head)
    for offset, node in enumerate(nodes):
        node.name = f"{p}/{offset}_{node.op_type}"
        graph.node.insert(at + offset, node)
    for output in graph.output:
        if output.name == logits:
            dim = output.type.tensor_type.shape.dim[1]
            dim.Clear()
            dim.dim_value = 1
    return model.SerializeToString()


def _lm_head(graph: Any, logits: str, mask: str) -> Any | None:
    if mask not in {i.name for i in graph.input}:
        return None
    declared = {o.name: o for o in graph.output}
    if logits not in declared or len(declared[logits].type.tensor_type.shape.dim) != 3:
        return None
    node = next((n for n in graph.node if logits in n.output), None)
    if node is None or len(node.input) < 2:
        return None
    weights = {i.name: i for i in graph.initializer}
    weight = weights.get(node.input[1])
    if weight is None:
        return None
    if node.op_type == "MatMul" and node.domain in ("", "ai.onnx"):
        return node if weight.data_type == _FLOAT and len(weight.dims) == 2 else None
    if node.op_type == "MatMulNBits" and node.domain == "com.microsoft":
        return node  # rows are quantised and summed independently; see the module docstring
    return None
