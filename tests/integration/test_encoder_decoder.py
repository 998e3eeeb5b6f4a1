"""Encoder-decoders over text on the one executor: the shared Marian fixture (encoder reads the
prompt + EOS, decoder takes [B] ids, the encoder's mask and a recurrent state) against the
reference's golden, and the Optimum/T5 layout (hidden states wired, no cross cache) from config.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import helper, numpy_helper

import genai_runtime as og
from tests.conftest import load_golden, require_shared
from tests.tiny_models import (
    DEFAULT_KV,
    FLOAT,
    HEAD_SIZE,
    HEADS,
    INT64,
    _kv_io,
    save_graph,
    write_config,
)


@pytest.fixture(scope="module")
def marian() -> og.Model:
    return og.Model(require_shared("fixtures", "onnxruntime-genai", "marian-batch-values"))


def test_marian_batch_values_golden(marian: og.Model) -> None:
    golden = load_golden("marian-batch-values")
    params = og.GeneratorParams(marian)
    params.set_search_options(**golden["runs"][0]["options"])
    generator = og.Generator(marian, params)
    rows = [run["input_ids"] for run in golden["runs"]]
    generator.append_tokens(np.array(rows))
    while not generator.is_done():
        generator.generate_next_token()
    for i, run in enumerate(golden["runs"]):
        assert generator.get_sequence(i).tolist() == run["output_ids"]
    # A new prompt after rewind_to(0) reruns the encoder on it; other rewinds are refused.
    with pytest.raises(og.GenaiRuntimeError, match="only rewind_to\\(0\\)"):
        generator.rewind_to(3)
    generator.rewind_to(0)
    generator.append_tokens(np.array([[7, 8], [5, 32000]]))
    generator.generate_next_token()
    assert generator.get_next_tokens().tolist() == [3, 2]


VOCAB, HIDDEN = 16, 8
RNG = np.random.default_rng(3)
EMBED = RNG.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
W_OUT = RNG.standard_normal((HIDDEN, VOCAB)).astype(np.float32)


def _t5_folder(root: Path) -> Path:
    """encoder: features -> last_hidden_state; decoder: ids + encoder_hidden_states + KV -> logits
    = (embed[ids] + mean(encoder states)) @ W."""
    feats = helper.make_tensor_value_info("features", FLOAT, ["batch", "frames", HIDDEN])
    last = helper.make_tensor_value_info("last_hidden_state", FLOAT, ["batch", "frames", HIDDEN])
    enc = helper.make_graph(
        [helper.make_node("Tanh", ["features"], ["last_hidden_state"])], "enc", [feats], [last]
    )
    save_graph(enc, root / "encoder.onnx")
    ids = helper.make_tensor_value_info("input_ids", INT64, ["batch", "seq"])
    states = helper.make_tensor_value_info(
        "encoder_hidden_states", FLOAT, ["batch", "frames", HIDDEN]
    )
    mask = helper.make_tensor_value_info("attention_mask", INT64, ["batch", "total"])
    logits = helper.make_tensor_value_info("logits", FLOAT, ["batch", "seq", VOCAB])
    kv_in, kv_out, kv_nodes = _kv_io(1, DEFAULT_KV, HEADS, HEAD_SIZE)
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["e"]),
        helper.make_node("ReduceMean", ["encoder_hidden_states", "axis1"], ["m"], keepdims=1),
        helper.make_node("Add", ["e", "m"], ["h"]),
        helper.make_node("MatMul", ["h", "w"], ["logits"]),
        *kv_nodes,
    ]
    init = [
        numpy_helper.from_array(EMBED, "embed"),
        numpy_helper.from_array(W_OUT, "w"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
    ]
    dec = helper.make_graph(nodes, "dec", [ids, states, mask, *kv_in], [logits, *kv_out], init)
    save_graph(dec, root / "decoder.onnx")
    doc = {
        "version": 2,
        "pipeline": {
            "extends": "encoder-decoder",
            "dataflow": [
                {"from": "encoder.last_hidden_state", "to": "decoder.encoder_hidden_states"}
            ],
        },
        "tokens": {"eos": [], "pad": 0},  # no EOS: runs to max_length
        "generation": {"max_length": 7},
    }
    return write_config(root, doc)


def test_optimum_layout_hidden_states_wired_from_config(tmp_path: Path) -> None:
    model = og.Model(_t5_folder(tmp_path))
    assert model.route.kind == "encoder-decoder"
    assert model.plan.cross is None  # no cross-cache inputs: the wire carries the states
    params = og.GeneratorParams(model)
    params.set_search_options(batch_size=2)
    generator = og.Generator(model, params)
    features = RNG.standard_normal((2, 5, HIDDEN)).astype(np.float32)
    generator.set_inputs({"features": features, "input_ids": np.array([[1, 2], [3, 4]])})
    while not generator.is_done():
        generator.generate_next_token()
    pooled = np.tanh(features).mean(axis=1)
    for row in range(2):
        tokens = [[1, 2], [3, 4]][row]
        while len(tokens) < 7:
            tokens.append(int(np.argmax((EMBED[tokens[-1]] + pooled[row]) @ W_OUT)))
        assert generator.get_sequence(row).tolist() == tokens


def test_mismatched_batch_across_stages_is_a_clear_error(tmp_path: Path) -> None:
    model = og.Model(_t5_folder(tmp_path))
    generator = og.Generator(model, og.GeneratorParams(model))  # batch_size 1
    features = np.zeros((3, 5, HIDDEN), np.float32)
    with pytest.raises(og.GenaiRuntimeError, match=r"encoder\.onnx: input 'features' has batch 3"):
        generator.set_inputs({"features": features, "input_ids": np.array([[1, 2]])})
    generator.set_inputs({"features": features[:1], "input_ids": np.array([[1, 2]])})
    generator.generate_next_token()  # still usable
