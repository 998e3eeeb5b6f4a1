"""The prompt-logits rewrite on tiny hand-built graphs, against NumPy: which graphs it edits, and
that the edited graph returns each right-padded row's last real logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper, save

from genai_runtime.runtime.prune import pruned_model_bytes

H, V = 4, 6
RNG = np.random.default_rng(0)
W = RNG.standard_normal((H, V)).astype(np.float32)


def _graph(tmp_path: Path, *, with_mask: bool = True, op: str = "MatMul", opset: int = 17) -> Path:
    inputs = [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["B", "S", H])]
    if with_mask:
        inputs.append(
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "T"])
        )
    if op == "MatMul":
        head = helper.make_node("MatMul", ["hidden", "w"], ["logits"])
    else:  # a lm_head the rewrite does not know: Einsum
        head = helper.make_node("Einsum", ["hidden", "w"], ["logits"], equation="bsh,hv->bsv")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["hidden"], ["h2"]), head],
        "tiny",
        inputs,
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", "S", V])],
        [numpy_helper.from_array(W, "w")],
    )
    path = tmp_path / "model.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8  # what this onnxruntime reads (newer onnx writes a newer default)
    save(model, str(path))
    return path


@pytest.mark.parametrize("opset", [11, 17])
def test_rows_are_each_rows_last_real_position(tmp_path: Path, opset: int) -> None:
    data = pruned_model_bytes(_graph(tmp_path, opset=opset), "logits", "attention_mask")
    assert data is not None
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    assert session.get_outputs()[0].shape == ["B", 1, V]
    hidden = RNG.standard_normal((3, 5, H)).astype(np.float32)
    lengths = [5, 2, 4]  # right-padded prompt pass, past 0: mask is [B, S]
    mask = np.array([[1] * n + [0] * (5 - n) for n in lengths], np.int64)
    (out,) = session.run(None, {"hidden": hidden, "attention_mask": mask})
    want = np.stack([hidden[i, n - 1] @ W for i, n in enumerate(lengths)])[:, None, :]
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    # A later pass: the mask covers past + this chunk; only its last S columns count.
    past_mask = np.ones((3, 7 + 1), np.int64)
    (out,) = session.run(None, {"hidden": hidden[:, :1], "attention_mask": past_mask})
    np.testing.assert_allclose(out, hidden[:, :1] @ W, rtol=1e-6, atol=1e-6)


def test_graphs_that_do_not_fit_are_left_alone(tmp_path: Path) -> None:
    assert pruned_model_bytes(_graph(tmp_path, with_mask=False), "logits", "attention_mask") is None
    assert pruned_model_bytes(_graph(tmp_path, op="Einsum"), "logits", "attention_mask") is None
    assert pruned_model_bytes(_graph(tmp_path), "other_name", "attention_mask") is None
