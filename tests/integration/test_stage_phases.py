"""Phases on the one executor, from config alone: a never-seen three-stage layout with an init
tower looped per image, a step decoder fed through ``inputs_embeds``, and a final stage.

The graphs are built here with onnx.helper; a NumPy reference of the same math gives the tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import helper, numpy_helper

import genai_runtime as og
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

VOCAB, HIDDEN, PIXELS = 16, 8, 4
RNG = np.random.default_rng(7)
W_TOWER = RNG.standard_normal((PIXELS, HIDDEN)).astype(np.float32)
TABLE = RNG.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
W_HEAD = RNG.standard_normal((HIDDEN, VOCAB)).astype(np.float32)


def _tower(path: Path) -> None:
    """pixels [1, 4] (one image per run) -> patch [1, hidden]."""
    pixels = helper.make_tensor_value_info("pixels", FLOAT, [1, PIXELS])
    patch = helper.make_tensor_value_info("patch", FLOAT, [1, HIDDEN])
    node = helper.make_node("MatMul", ["pixels", "w"], ["patch"])
    graph = helper.make_graph(
        [node], "tower", [pixels], [patch], initializer=[numpy_helper.from_array(W_TOWER, "w")]
    )
    save_graph(graph, path)


def _mixer(path: Path) -> None:
    """token_ids [B, S] + patches [N, hidden] -> mixed = table[ids] + sum(patches)."""
    ids = helper.make_tensor_value_info("token_ids", INT64, ["batch", "seq"])
    patches = helper.make_tensor_value_info("patches", FLOAT, ["images", HIDDEN])
    mixed = helper.make_tensor_value_info("mixed", FLOAT, ["batch", "seq", HIDDEN])
    nodes = [
        helper.make_node("Gather", ["table", "token_ids"], ["embedded"]),
        helper.make_node("ReduceSum", ["patches", "axis0"], ["pooled"], keepdims=0),
        helper.make_node("Add", ["embedded", "pooled"], ["mixed"]),
    ]
    init = [
        numpy_helper.from_array(TABLE, "table"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
    ]
    graph = helper.make_graph(nodes, "mixer", [ids, patches], [mixed], initializer=init)
    save_graph(graph, path)


def _head(path: Path) -> None:
    """inputs_embeds + mask + KV -> scores [B, S, vocab] = embeds @ W (KV passed through)."""
    embeds = helper.make_tensor_value_info("inputs_embeds", FLOAT, ["batch", "seq", HIDDEN])
    mask = helper.make_tensor_value_info("attention_mask", INT64, ["batch", "total"])
    scores = helper.make_tensor_value_info("scores", FLOAT, ["batch", "seq", VOCAB])
    kv_in, kv_out, kv_nodes = _kv_io(1, DEFAULT_KV, HEADS, HEAD_SIZE)
    nodes = [helper.make_node("MatMul", ["inputs_embeds", "w"], ["scores"]), *kv_nodes]
    graph = helper.make_graph(
        nodes, "head", [embeds, mask, *kv_in], [scores, *kv_out],
        initializer=[numpy_helper.from_array(W_HEAD, "w")],
    )  # fmt: skip
    save_graph(graph, path)


def _summary(path: Path) -> None:
    """last_scores [B, S, vocab] -> total [B] (sum over the last pass's scores)."""
    scores = helper.make_tensor_value_info("last_scores", FLOAT, ["batch", "seq", VOCAB])
    total = helper.make_tensor_value_info("total", FLOAT, ["batch"])
    node = helper.make_node("ReduceSum", ["last_scores", "axes"], ["total"], keepdims=0)
    init = [numpy_helper.from_array(np.array([1, 2], np.int64), "axes")]
    graph = helper.make_graph([node], "summary", [scores], [total], initializer=init)
    save_graph(graph, path)


def _folder(root: Path, **overrides) -> Path:
    _tower(root / "tower.onnx")
    _mixer(root / "mixer.onnx")
    _head(root / "head.onnx")
    _summary(root / "summary.onnx")
    pipeline = {
        "sessions": {
            "tower": {"file": "tower.onnx"},
            "mixer": {"file": "mixer.onnx", "inputs": {"input_ids": "token_ids"}},
            "head": {"file": "head.onnx", "outputs": {"logits": "scores"}},
            "summary": {"file": "summary.onnx"},
        },
        "flow": [
            {"run": "tower", "when": "init", "loop": "per_image"},
            {"run": "mixer", "when": "step"},
            {"run": "head", "when": "step"},
            {"run": "summary", "when": "final"},
        ],
        "dataflow": [
            {"from": "tower.patch", "to": "mixer.patches"},
            {"from": "mixer.mixed", "to": "head.inputs_embeds"},
            {"from": "head.scores", "to": "summary.last_scores"},
        ],
        **overrides,
    }
    doc = {
        "version": 2,
        "pipeline": pipeline,
        "tokens": {"eos": [], "pad": 0},  # no EOS: runs to max_length
        "generation": {"max_length": 9},
        "metadata": {"model_type": "never-seen-architecture"},
    }
    return write_config(root, doc)


def _reference(prompt: list[int], pixels: np.ndarray, max_length: int) -> tuple[list[int], float]:
    pooled = (pixels @ W_TOWER).sum(axis=0)
    tokens = list(prompt)
    new = prompt
    while len(tokens) < max_length:
        scores = (TABLE[new] + pooled) @ W_HEAD
        nxt = int(np.argmax(scores[-1]))
        tokens.append(nxt)
        new = [nxt]
    # The final stage sees the scores of the last pass that ran (the one that produced the
    # last token's logits), i.e. the pass over the second-to-last token.
    last = (TABLE[tokens[-2:-1]] + pooled) @ W_HEAD
    return tokens, float(last.sum())


@pytest.mark.parametrize("images", [1, 3])
def test_never_seen_layout_runs_init_per_image_step_and_final_once(
    tmp_path: Path, images: int
) -> None:
    model = og.Model(_folder(tmp_path))
    assert model.route.kind == "multimodal"
    generator = og.Generator(model, og.GeneratorParams(model))
    stages = {s.plan.name: s for s in generator._exec.stages}
    runs = dict.fromkeys(stages, 0)
    for name, stage in stages.items():  # count real session runs
        original = stage.bound.run

        def counted(name=name, original=original) -> None:
            runs[name] += 1
            original()

        stage.bound.run = counted
    pixels = RNG.standard_normal((images, PIXELS)).astype(np.float32)
    prompt = [3, 1, 4]
    generator.set_inputs(og.NamedTensors({"pixels": pixels, "input_ids": np.array([prompt])}))
    while not generator.is_done():
        generator.generate_next_token()
    tokens, total = _reference(prompt, pixels, 9)
    assert generator.get_sequence(0).tolist() == tokens
    assert runs == {"tower": images, "mixer": 6, "head": 6, "summary": 1}
    assert generator.get_output("total") == pytest.approx(np.array([total]), rel=1e-5)
    assert generator.get_output("patch").shape == (images, HIDDEN)  # joined over images
    generator.get_output("total")
    assert runs["summary"] == 1


def test_per_image_loop_with_no_images_is_a_clear_error(tmp_path: Path) -> None:
    model = og.Model(_folder(tmp_path))
    generator = og.Generator(model, og.GeneratorParams(model))
    generator.set_model_input("pixels", np.zeros((0, PIXELS), np.float32))
    with pytest.raises(og.GenaiRuntimeError, match=r"tower\.onnx \(loop per_image\) has no images"):
        generator.append_tokens([[1, 2]])
    pixels = np.ones((2, PIXELS), np.float32)
    generator.set_model_input("pixels", pixels)  # still usable
    generator.append_tokens([[1, 2]])
    generator.generate_next_token()
    tokens, _ = _reference([1, 2], pixels, 3)
    assert generator.get_sequence(0).tolist() == tokens


def test_wire_to_a_missing_tensor_names_the_file_and_the_tensor(tmp_path: Path) -> None:
    folder = _folder(
        tmp_path,
        dataflow=[
            {"from": "tower.patch", "to": "mixer.patchez"},
            {"from": "mixer.mixed", "to": "head.inputs_embeds"},
            {"from": "head.scores", "to": "summary.last_scores"},
        ],
    )
    with pytest.raises(og.GenaiRuntimeError, match=r"mixer\.onnx has no input 'patchez'"):
        og.Model(folder)


def test_no_model_type_branches_in_the_runtime() -> None:
    """Routing and execution never look at a model type string."""
    root = Path(og.__file__).parent / "runtime"
    for path in root.glob("*.py"):
        text = path.read_text()
        for needle in ("model.type", "model_type", '"whisper"', '"marian', '"phi3', '"llama"'):
            assert needle not in text, f"{path.name} mentions {needle}"
