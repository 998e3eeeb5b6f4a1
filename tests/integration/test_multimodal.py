"""Multimodal graphs on the one executor, from given tensors: the shared phi3-v and
multimodal-decoder-with-input-ids dummies (vision looped per image -> embedding -> decoder via
inputs_embeds) against the same graphs chained by hand with onnxruntime, and a tri-modal single
pass built here next to a NumPy reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import genai_runtime as og
from tests.conftest import require_shared
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

RNG = np.random.default_rng(11)


def _by_hand(folder: Path, pixels, sizes, ids, kv_heads, head_size, steps=1, ids_dtype=np.int64):
    """Vision per image, concatenated; embedding; decoder with an empty past: greedy ids."""
    vision = ort.InferenceSession(str(folder / "dummy_vision.onnx"))
    embed = ort.InferenceSession(str(folder / "dummy_embedding.onnx"))
    text = ort.InferenceSession(str(folder / "dummy_text.onnx"))
    feats = np.concatenate(
        [vision.run(None, {"pixel_values": pixels[i : i + 1], "image_sizes": sizes[i : i + 1]})[0]
         for i in range(len(pixels))]
    )  # fmt: skip
    names = {i.name for i in text.get_inputs()}
    batch = ids.shape[0]
    past = np.zeros((batch, kv_heads, 0, head_size), np.float32)
    kv = {"past_key_values.0.key": past, "past_key_values.0.value": past}
    seq, new, all_logits = ids.astype(ids_dtype), ids.astype(ids_dtype), []
    for _ in range(steps):
        embeds = embed.run(None, {"input_ids": new, "image_features": feats})[0]
        feed = {"inputs_embeds": embeds, **kv}
        if "attention_mask" in names:
            feed["attention_mask"] = np.ones((batch, seq.shape[1]), np.int64)
        if "input_ids" in names:
            feed["input_ids"] = new
        logits, k, v = text.run(None, feed)
        all_logits.append(logits[:, -1])
        kv = {"past_key_values.0.key": k, "past_key_values.0.value": v}
        new = logits[:, -1].argmax(-1).astype(ids_dtype)[:, None]
        seq = np.concatenate([seq, new], axis=1)
    return feats, seq, all_logits


def test_phi3v_dummy_runs_from_given_tensors() -> None:
    folder = require_shared("fixtures", "onnxruntime-genai", "phi3-v")
    model = og.Model(folder)
    assert model.route.kind == "multimodal"
    pixels = RNG.standard_normal((1, 2, 3, 4, 4)).astype(np.float16)
    sizes = np.array([[4, 4]], np.int64)
    ids = np.array([[1, 5], [1, 7]])
    feats, _, logits = _by_hand(folder, pixels, sizes, ids, 32, 96)
    params = og.GeneratorParams(model)
    params.set_search_options(batch_size=2, max_length=8, past_present_share_buffer=False)
    generator = og.Generator(model, params)
    inputs = og.NamedTensors({"pixel_values": pixels, "image_sizes": sizes, "input_ids": ids})
    generator.set_inputs(inputs)  # the dummy's shapes are fixed to this prompt pass
    np.testing.assert_array_equal(generator.get_output("image_features"), feats)
    np.testing.assert_allclose(generator.get_logits()[:, 0], logits[0], atol=1e-5)


@pytest.mark.parametrize("images", [1, 3])
def test_decoder_with_input_ids_dummy_generates_like_the_graphs_by_hand(images: int) -> None:
    folder = require_shared("fixtures", "onnxruntime-genai", "multimodal-decoder-with-input-ids")
    model = og.Model(folder)
    pixels = RNG.standard_normal((images, 1, 3, 4, 4)).astype(np.float32)
    sizes = np.full((images, 2), 4, np.int64)
    ids = np.array([[3]])
    feats, expected, _ = _by_hand(folder, pixels, sizes, ids, 4, 16, steps=4, ids_dtype=np.int32)
    assert feats.shape == (images, 64)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=5)
    generator = og.Generator(model, params)
    generator.set_inputs({"pixel_values": pixels, "image_sizes": sizes, "input_ids": ids})
    while not generator.is_done():
        generator.generate_next_token()
    assert generator.get_sequence(0).tolist() == expected[0].tolist()
    assert generator.get_output("image_features").shape == (images, 64)


HIDDEN, VOCAB = 8, 16
W_IMG = RNG.standard_normal((6, HIDDEN)).astype(np.float32)
W_AUD = RNG.standard_normal((5, HIDDEN)).astype(np.float32)
TABLE = RNG.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
W_OUT = RNG.standard_normal((HIDDEN, VOCAB)).astype(np.float32)


def _tri_modal(root: Path) -> Path:
    """vision (init, per image) and speech (init, batched) feed one embedding stage that merges
    text, image and audio in a single pass; a decoder turns inputs_embeds into logits."""

    def graph(name, nodes, ins, outs, inits):
        save_graph(helper.make_graph(nodes, name, ins, outs, inits), root / f"{name}.onnx")

    vi = helper.make_tensor_value_info
    graph(
        "vision",
        [helper.make_node("MatMul", ["pixels", "w"], ["image_features"])],
        [vi("pixels", FLOAT, [1, 6])],
        [vi("image_features", FLOAT, [1, HIDDEN])],
        [numpy_helper.from_array(W_IMG, "w")],
    )
    graph(
        "speech",
        [helper.make_node("MatMul", ["audio", "w"], ["audio_features"])],
        [vi("audio", FLOAT, ["frames", 5])],
        [vi("audio_features", FLOAT, ["frames", HIDDEN])],
        [numpy_helper.from_array(W_AUD, "w")],
    )
    axis0 = numpy_helper.from_array(np.array([0], np.int64), "axis0")
    graph(
        "embedding",
        [
            helper.make_node("Gather", ["table", "input_ids"], ["t"]),
            helper.make_node("ReduceMean", ["image_features", "axis0"], ["i"], keepdims=0),
            helper.make_node("ReduceMean", ["audio_features", "axis0"], ["a"], keepdims=0),
            helper.make_node("Add", ["t", "i"], ["ti"]),
            helper.make_node("Add", ["ti", "a"], ["inputs_embeds"]),
        ],
        [
            vi("input_ids", INT64, ["batch", "seq"]),
            vi("image_features", FLOAT, ["n", HIDDEN]),
            vi("audio_features", FLOAT, ["frames", HIDDEN]),
        ],
        [vi("inputs_embeds", FLOAT, ["batch", "seq", HIDDEN])],
        [numpy_helper.from_array(TABLE, "table"), axis0],
    )
    kv_in, kv_out, kv_nodes = _kv_io(1, DEFAULT_KV, HEADS, HEAD_SIZE)
    graph("decoder", [helper.make_node("MatMul", ["inputs_embeds", "w"], ["logits"]), *kv_nodes],
          [vi("inputs_embeds", FLOAT, ["batch", "seq", HIDDEN]),
           vi("attention_mask", INT64, ["batch", "total"]), *kv_in],
          [vi("logits", FLOAT, ["batch", "seq", VOCAB]), *kv_out],
          [numpy_helper.from_array(W_OUT, "w")])  # fmt: skip
    doc = {
        "version": 2,
        "pipeline": {
            "sessions": {n: {"file": f"{n}.onnx"} for n in ("vision", "speech", "embedding",
                                                            "decoder")},
            "flow": [
                {"run": "vision", "when": "init", "loop": "per_image"},
                {"run": "speech", "when": "init"},
                {"run": "embedding", "when": "step"},
                {"run": "decoder", "when": "step"},
            ],
            "dataflow": [
                {"from": "vision.image_features", "to": "embedding.image_features"},
                {"from": "speech.audio_features", "to": "embedding.audio_features"},
                {"from": "embedding.inputs_embeds", "to": "decoder.inputs_embeds"},
            ],
        },
        "tokens": {"eos": [], "pad": 0},  # no EOS: runs to max_length
        "generation": {"max_length": 8},
    }  # fmt: skip
    return write_config(root, doc)


def test_tri_modal_single_pass_matches_numpy(tmp_path: Path) -> None:
    model = og.Model(_tri_modal(tmp_path))
    pixels = RNG.standard_normal((3, 6)).astype(np.float32)
    audio = RNG.standard_normal((7, 5)).astype(np.float32)
    generator = og.Generator(model, og.GeneratorParams(model))
    generator.set_inputs({"pixels": pixels, "audio": audio, "input_ids": np.array([[2, 9]])})
    while not generator.is_done():
        generator.generate_next_token()
    bias = (pixels @ W_IMG).mean(0) + (audio @ W_AUD).mean(0)
    tokens = [2, 9]
    while len(tokens) < 8:
        tokens.append(int(np.argmax((TABLE[tokens[-1]] + bias) @ W_OUT)))
    assert generator.get_sequence(0).tolist() == tokens
