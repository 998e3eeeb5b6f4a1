"""attention_mask, position_ids, sequence-length scalars and the concat cache's contents, seen
from inside a real graph: a tiny decoder that echoes what it is fed, checked against the
reference's rules written out in NumPy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from tiny_models import IR_VERSION, OPSET, write_config

import genai_runtime as og

VOCAB = 12
PAD = 0


def _probe(folder: Path) -> Path:
    """Echo the mask, positions and length scalars; keep token ids in the "key" cache and
    positions in the "value" cache (Concat, so the cache holds the whole history)."""
    i64, f32, i32 = TensorProto.INT64, TensorProto.FLOAT, TensorProto.INT32
    inputs = [
        helper.make_tensor_value_info("input_ids", i64, ["b", "s"]),
        helper.make_tensor_value_info("attention_mask", i64, ["b", "t"]),
        helper.make_tensor_value_info("position_ids", i64, ["b", "s"]),
        helper.make_tensor_value_info("past_sequence_length", i32, [1]),
        helper.make_tensor_value_info("total_sequence_length", i32, []),
        helper.make_tensor_value_info("past_key_values.0.key", f32, ["b", 1, "p", 1]),
        helper.make_tensor_value_info("past_key_values.0.value", f32, ["b", 1, "p", 1]),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", f32, ["b", "s", VOCAB]),
        helper.make_tensor_value_info("present.0.key", f32, ["b", 1, "t", 1]),
        helper.make_tensor_value_info("present.0.value", f32, ["b", 1, "t", 1]),
        helper.make_tensor_value_info("mask_seen", i64, ["b", "t"]),
        helper.make_tensor_value_info("positions_seen", i64, ["b", "s"]),
        helper.make_tensor_value_info("past_seen", i32, [1]),
        helper.make_tensor_value_info("total_seen", i32, []),
    ]
    axes = helper.make_tensor("axes", i64, [2], [1, 3])
    weights = helper.make_tensor("w", f32, [1, VOCAB], list(range(VOCAB)))
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids_f"], to=f32),
        helper.make_node("Cast", ["position_ids"], ["pos_f"], to=f32),
        helper.make_node("Unsqueeze", ["ids_f", "axes"], ["ids_4d"]),
        helper.make_node("Unsqueeze", ["pos_f", "axes"], ["pos_4d"]),
        helper.make_node("Concat", ["past_key_values.0.key", "ids_4d"], ["present.0.key"], axis=2),
        helper.make_node(
            "Concat", ["past_key_values.0.value", "pos_4d"], ["present.0.value"], axis=2
        ),
        # logits[b, s, v] = id * v: the argmax is always the last id (VOCAB - 1).
        helper.make_node("Unsqueeze", ["ids_f", "last"], ["ids_3d"]),
        helper.make_node("MatMul", ["ids_3d", "w"], ["logits"]),
        helper.make_node("Identity", ["attention_mask"], ["mask_seen"]),
        helper.make_node("Identity", ["position_ids"], ["positions_seen"]),
        helper.make_node("Identity", ["past_sequence_length"], ["past_seen"]),
        helper.make_node("Identity", ["total_sequence_length"], ["total_seen"]),
    ]
    last = helper.make_tensor("last", i64, [1], [-1])
    graph = helper.make_graph(nodes, "probe", inputs, outputs, initializer=[axes, weights, last])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.save(model, str(folder / "model.onnx"))
    return folder


@pytest.fixture
def probe(tmp_path: Path) -> og.Model:
    _probe(tmp_path)
    doc = {
        "model": {
            "type": "probe",
            "bos_token_id": 1,
            "eos_token_id": PAD,  # in the vocabulary (now required), never generated
            "pad_token_id": PAD,
            "vocab_size": VOCAB,
            "context_length": 32,
            "decoder": {
                "filename": "model.onnx",
                "num_hidden_layers": 1,
                "num_key_value_heads": 1,
                "head_size": 1,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "position_ids": "position_ids",
                    "past_sequence_length": "past_sequence_length",
                    "total_sequence_length": "total_sequence_length",
                },
            },
        },
        "search": {"max_length": 32},
    }
    write_config(tmp_path, doc)
    return og.Model(tmp_path)


def _generator(model: og.Model, **options) -> og.Generator:
    params = og.GeneratorParams(model)
    params.set_search_options(**options)
    return og.Generator(model, params)


def _seen(generator: og.Generator) -> dict[str, np.ndarray]:
    names = ("mask_seen", "positions_seen", "past_seen", "total_seen")
    return {name: generator.get_output(name) for name in names}


def test_right_padded_batch_follows_the_reference_rules(probe: og.Model) -> None:
    prompt = np.array([[5, 6, 7, PAD, PAD], [5, 6, 7, 8, 9]])
    generator = _generator(probe, batch_size=2, max_length=9)
    generator.append_tokens(prompt)
    seen = _seen(generator)
    # Trailing pads: mask 0, position 0; every other column its index.
    np.testing.assert_array_equal(seen["mask_seen"], [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(seen["positions_seen"], [[0, 1, 2, 0, 0], [0, 1, 2, 3, 4]])
    assert (seen["past_seen"].tolist(), int(seen["total_seen"])) == ([0], 5)
    generator.generate_next_token()
    # Logits come from each row's last real token (ids 7 and 9, argmax 11), not from the pad
    # at the end of row 0 (id 0: all-zero logits, argmax 0).
    assert generator.get_next_tokens().tolist() == [VOCAB - 1, VOCAB - 1]
    generator.generate_next_token()  # runs the first generated token
    seen = _seen(generator)
    np.testing.assert_array_equal(seen["mask_seen"], [[1, 1, 1, 0, 0, 1], [1, 1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(seen["positions_seen"], [[3], [5]])  # each row's next position
    assert (seen["past_seen"].tolist(), int(seen["total_seen"])) == ([5], 6)
    generator.generate_next_token()
    np.testing.assert_array_equal(_seen(generator)["positions_seen"], [[4], [6]])


def test_batch_one_continues_positions_across_appends_and_rewinds(probe: og.Model) -> None:
    generator = _generator(probe, max_length=20)
    generator.append_tokens([3, 4, 5])
    for _ in range(3):
        generator.generate_next_token()
    generator.append_tokens([6, 7])  # runs the pending token and the two new ones
    seen = _seen(generator)
    np.testing.assert_array_equal(seen["positions_seen"], [[5, 6, 7]])
    np.testing.assert_array_equal(seen["mask_seen"], np.ones((1, 8)))
    assert (seen["past_seen"].tolist(), int(seen["total_seen"])) == ([5], 8)
    # The concat cache holds exactly the sequence and its positions.
    sequence = generator.get_sequence(0)
    np.testing.assert_array_equal(generator.get_output("present.0.key").ravel(), sequence)
    np.testing.assert_array_equal(generator.get_output("present.0.value").ravel(), range(8))

    generator.rewind_to(4)
    generator.generate_next_token()  # reruns token 4 (index 3) on a cache cut to 3 tokens
    np.testing.assert_array_equal(_seen(generator)["positions_seen"], [[3]])
    np.testing.assert_array_equal(generator.get_output("present.0.key").ravel(), sequence[:4])
