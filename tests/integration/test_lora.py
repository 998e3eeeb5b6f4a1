"""LoRA adapters in onnxruntime's adapter format on a tiny decoder with two LoRA sites
(``tests/lora_models.py``): logits equal a NumPy forward pass over merged weights, adapters switch
per generator, onnxruntime-genai 0.18 loads the same files and agrees, mismatched adapters are
refused naming the file and the tensor, and the server picks an adapter by ``base:adapter``."""

from __future__ import annotations

import gc
import importlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

import genai_runtime as og
from genai_runtime.errors import GenaiRuntimeError, GenerationError, ModelError
from tests import lora_models as lm

PROMPT = np.array([1, 5, 9, 3, 17], np.int32)
NEW_TOKENS = 6


def _reference():
    if os.environ.get("CI", "").lower() == "true":
        return importlib.import_module("onnxruntime_genai")
    return pytest.importorskip("onnxruntime_genai")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The model, two full adapters (a, b) and two half ones (proj only, head only)."""
    root = lm.model_folder(tmp_path_factory.mktemp("lora"), lm.base_weights())
    a, b = lm.lora_weights(1), lm.lora_weights(2)
    lm.write_adapter(root / "a.onnx_adapter", a)
    lm.write_adapter(root / "b.onnx_adapter", b)
    lm.write_adapter(root / "proj.onnx_adapter", {k: v for k, v in a.items() if "proj" in k})
    lm.write_adapter(root / "head.onnx_adapter", {k: v for k, v in b.items() if "head" in k})
    return root


@pytest.fixture(scope="module")
def model(folder: Path) -> og.Model:
    return og.Model(str(folder))


def _run(module, model, adapters=None, names=(), steps: int = NEW_TOKENS):
    """Greedy run: the sequence and the logits before each new token ([steps + 1, V])."""
    params = module.GeneratorParams(model)
    params.set_search_options(max_length=len(PROMPT) + steps, do_sample=False)
    generator = module.Generator(model, params)
    for name in names:
        generator.set_active_adapter(adapters, name)
    generator.append_tokens(PROMPT)
    rows = []
    while not generator.is_done():
        rows.append(generator.get_logits()[0, -1].copy())
        generator.generate_next_token()
    return generator.get_sequence(0).tolist(), np.array(rows)


def _numpy(sequence: list[int], lora, rows: int) -> np.ndarray:
    """NumPy's logits where ``_run`` read ``rows`` of them: after the prompt, then each token."""
    logits = lm.reference_logits(np.array(sequence), lm.base_weights(), lora)
    return logits[len(PROMPT) - 1 : len(PROMPT) - 1 + rows]


def test_adapter_logits_equal_merged_weights_and_switch_per_generator(model, folder) -> None:
    adapters = og.Adapters(model)
    adapters.load(str(folder / "a.onnx_adapter"), "a")
    adapters.load(folder / "b.onnx_adapter", "b")
    a, b = lm.lora_weights(1), lm.lora_weights(2)
    runs = {
        "base": (_run(og, model), None),
        "a": (_run(og, model, adapters, ["a"]), a),
        "b": (_run(og, model, adapters, ["b"]), b),
    }
    for name, ((sequence, logits), lora) in runs.items():
        expected = _numpy(sequence, lora, len(logits))
        np.testing.assert_allclose(logits, expected, atol=1e-4, err_msg=name)
        assert sequence[: len(PROMPT)] == PROMPT.tolist()
    # The adapters change the logits (non-zero weights), so the three runs differ.
    assert np.abs(runs["a"][0][1][0] - runs["base"][0][1][0]).max() > 0.1
    assert runs["a"][0][0] != runs["b"][0][0]

    # Two live generators on one model, stepped in turn, each with its own adapter.
    gens = {}
    for name in ("a", "b"):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(PROMPT) + NEW_TOKENS)
        gens[name] = og.Generator(model, params)
        gens[name].set_active_adapter(adapters, name)
        gens[name].append_tokens(PROMPT)
    while not all(g.is_done() for g in gens.values()):
        for g in gens.values():
            if not g.is_done():
                g.generate_next_token()
    for name, g in gens.items():
        assert g.get_sequence(0).tolist() == runs[name][0][0]


def test_two_adapters_on_one_generator_add_their_tensors(model, folder) -> None:
    adapters = og.Adapters(model)
    adapters.load(str(folder / "proj.onnx_adapter"), "proj")
    adapters.load(str(folder / "head.onnx_adapter"), "head")
    adapters.load(str(folder / "a.onnx_adapter"), "a")
    sequence, logits = _run(og, model, adapters, ["proj", "head"])
    a, b = lm.lora_weights(1), lm.lora_weights(2)
    both = {
        **{k: v for k, v in a.items() if "proj" in k},
        **{k: v for k, v in b.items() if "head" in k},
    }
    np.testing.assert_allclose(logits, _numpy(sequence, both, len(logits)), atol=1e-4)
    # "a" sets the same tensors again: refused, naming the tensor and the adapter holding it.
    params = og.GeneratorParams(model)
    generator = og.Generator(model, params)
    generator.set_active_adapter(adapters, "proj")
    with pytest.raises(GenerationError, match=r"'a' sets 'lora\.proj\.[AB]'.*'proj' already"):
        generator.set_active_adapter(adapters, "a")
    with pytest.raises(GenerationError, match="single Adapters container"):
        generator.set_active_adapter(og.Adapters(model), "a")


def test_the_reference_loads_the_same_files_and_agrees(model, folder) -> None:
    ref = _reference()
    ref_model = ref.Model(str(folder))
    ref_adapters = ref.Adapters(ref_model)
    ours = og.Adapters(model)
    for name in ("a", "b"):
        ref_adapters.load(str(folder / f"{name}.onnx_adapter"), name)
        ours.load(str(folder / f"{name}.onnx_adapter"), name)
    for names in ((), ("a",), ("b",)):
        ref_seq, ref_logits = _run(ref, ref_model, ref_adapters, names)
        seq, logits = _run(og, model, ours, names)
        assert seq == ref_seq, names
        n = min(len(logits), len(ref_logits))
        np.testing.assert_allclose(logits[:n], ref_logits[:n], atol=1e-4, err_msg=str(names))


def test_an_adapter_feeds_lora_inputs_without_defaults(folder, tmp_path) -> None:
    model = og.Model(str(lm.model_folder(tmp_path, lm.base_weights(), defaults=False)))
    with pytest.raises(GenerationError, match=r"needs input 'lora\.proj\.A'"):
        _run(og, model)
    adapters = og.Adapters(model)
    adapters.load(str(folder / "b.onnx_adapter"), "b")
    sequence, logits = _run(og, model, adapters, ["b"])
    expected = _numpy(sequence, lm.lora_weights(2), len(logits))
    np.testing.assert_allclose(logits, expected, atol=1e-4)


def test_mismatched_adapters_name_the_file_and_the_tensor(model, tmp_path) -> None:
    adapters = og.Adapters(model)
    shapes = dict(lm.LORA_SHAPES)
    wrong_rank = tmp_path / "rank3.onnx_adapter"
    lm.write_adapter(wrong_rank, {"lora.head.A": np.ones((lm.DIM, 3), np.float32)})
    with pytest.raises(ModelError, match=r"rank3\.onnx_adapter.*lora\.head\.A.*\[8, 3\].*\[8, 2\]"):
        adapters.load(str(wrong_rank), "x")
    wrong_type = tmp_path / "fp16.onnx_adapter"
    lm.write_adapter(wrong_type, {"lora.proj.B": np.ones(shapes["lora.proj.B"], np.float16)})
    with pytest.raises(ModelError, match=r"fp16\.onnx_adapter.*lora\.proj\.B: tensor\(float16\)"):
        adapters.load(str(wrong_type), "x")
    unknown = tmp_path / "unknown.onnx_adapter"
    lm.write_adapter(unknown, {"lora.nope.A": np.ones((2, 2), np.float32)})
    with pytest.raises(ModelError, match=r"unknown\.onnx_adapter.*lora\.nope\.A.*matches no input"):
        adapters.load(str(unknown), "x")
    junk = tmp_path / "junk.onnx_adapter"
    junk.write_bytes(b"not an adapter" * 8)
    with pytest.raises(ModelError, match=r"junk\.onnx_adapter: not an onnxruntime adapter"):
        adapters.load(str(junk), "x")
    with pytest.raises(ModelError, match="adapter file not found"):
        adapters.load(str(tmp_path / "missing.onnx_adapter"), "x")
    assert adapters.names() == []


def test_load_unload_names_and_in_use(model, folder) -> None:
    adapters = og.Adapters(model)
    adapters.load(str(folder / "a.onnx_adapter"), "a")
    with pytest.raises(GenerationError, match="'a' is already loaded"):
        adapters.load(str(folder / "b.onnx_adapter"), "a")
    with pytest.raises(GenerationError, match=r"'zz' is not loaded \(loaded: 'a'\)"):
        adapters.unload("zz")
    generator = og.Generator(model, og.GeneratorParams(model))
    with pytest.raises(GenerationError, match="'zz' is not loaded"):
        generator.set_active_adapter(adapters, "zz")
    generator.set_active_adapter(adapters, "a")
    with pytest.raises(GenerationError, match="'a' is still in use by 1 generator"):
        adapters.unload("a")
    del generator
    gc.collect()
    adapters.unload("a")
    assert "a" not in adapters
    with pytest.raises(GenaiRuntimeError, match="expected a Model"):
        og.Adapters("model")


def _greedy(lora, count: int) -> list[int]:
    """``count`` greedy tokens after PROMPT over the merged weights (NumPy)."""
    sequence = PROMPT.tolist()
    for _ in range(count):
        logits = lm.reference_logits(np.array(sequence), lm.base_weights(), lora)
        sequence.append(int(logits[-1].argmax()))
    return sequence[len(PROMPT) :]


def test_server_picks_the_adapter_by_model_name(folder) -> None:
    httpx = pytest.importorskip("httpx")  # raw HTTP: the openai client takes seconds to import
    pytest.importorskip("starlette")
    from genai_runtime.server import ServerHandle

    lm.word_tokenizer(folder)
    adapters = {"a": str(folder / "a.onnx_adapter"), "b": str(folder / "b.onnx_adapter")}
    # One slot: each request reuses it, with its cached prefix only under the same adapter.
    handle = ServerHandle(
        str(folder), port=0, served_name="tiny", adapters=adapters, max_active=1
    ).start()
    try:
        with httpx.Client(base_url=handle.url + "/v1", timeout=30) as client:
            names = [m["id"] for m in client.get("/models").json()["data"]]
            assert names == ["tiny", "tiny:a", "tiny:b"]
            assert client.get("/models/tiny:b").json()["parent"] == "tiny"
            loras = {"tiny": None, "tiny:a": lm.lora_weights(1), "tiny:b": lm.lora_weights(2)}
            for name in ["tiny:a", "tiny:a", "tiny", "tiny:b", "tiny:a"]:
                body = {"model": name, "prompt": PROMPT.tolist(), "max_tokens": 4, "temperature": 0}
                reply = client.post("/completions", json=body)
                assert reply.status_code == 200, reply.text
                got = [int(t) for t in re.findall(r"w(\d+)", reply.json()["choices"][0]["text"])]
                assert got and got == _greedy(loras[name], len(got)), name
            reply = client.post("/completions", json={**body, "model": "tiny:zz"})
            assert reply.status_code == 404 and "tiny:zz" in reply.json()["error"]["message"]
    finally:
        handle.stop()


def test_adapter_tensors_are_copied_to_a_device_once_per_file(folder) -> None:
    """On a device (copy-on-bind emulation) an adapter's tensors are bound from device copies
    made the first time a generator uses the file: a second generator copies nothing of them,
    and the logits stay those of the merged weights."""
    from genai_runtime.session.census import measure
    from genai_runtime.session.device import COPY_ON_BIND

    config = og.Config(str(folder))
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {COPY_ON_BIND: "1"}}}}))
    model = og.Model(config)
    adapters = og.Adapters(model)
    adapters.load(str(folder / "a.onnx_adapter"), "a")
    adapter_bytes = sum(a.nbytes for a in lm.lora_weights(1).values())
    copied = []
    for _ in range(2):
        with measure() as m:
            sequence, logits = _run(og, model, adapters, ["a"])
        copied.append(m.census.host_to_device_bytes)
        expected = _numpy(sequence, lm.lora_weights(1), len(logits))
        np.testing.assert_allclose(logits, expected, atol=1e-4)
    assert copied[0] - copied[1] == adapter_bytes
