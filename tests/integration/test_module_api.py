"""onnxruntime-genai's module-level API on genai_runtime, checked side by side with the reference:
provider probes, logging switches and callback, telemetry switches, Tensor/NamedTensors,
Model.device_type, and clear UnsupportedErrors for the media processors not built yet."""

from __future__ import annotations

import importlib
import os

import numpy as np
import onnxruntime as ort
import pytest
from conftest import require_shared

import genai_runtime as og
from genai_runtime.errors import GenaiRuntimeError

PROBES = {
    "is_cuda_available": "CUDAExecutionProvider",
    "is_dml_available": "DmlExecutionProvider",
    "is_rocm_available": "ROCMExecutionProvider",
    "is_webgpu_available": "WebGpuExecutionProvider",
    "is_qnn_available": "QNNExecutionProvider",
    "is_openvino_available": "OpenVINOExecutionProvider",
}


def _reference():
    if os.environ.get("CI", "").lower() == "true":
        return importlib.import_module("onnxruntime_genai")
    return pytest.importorskip("onnxruntime_genai")


def _gpt2_step(module) -> None:
    model = module.Model(
        str(require_shared("fixtures", "onnxruntime-genai", "tiny-random-gpt2-fp32"))
    )
    generator = module.Generator(model, module.GeneratorParams(model))
    generator.append_tokens(np.array([[0, 0, 0, 52]], dtype=np.int32))
    generator.generate_next_token()


@pytest.mark.parametrize("name", sorted(PROBES))
def test_provider_probes_answer_for_the_loaded_onnxruntime(name: str) -> None:
    assert getattr(og, name)() is (PROBES[name] in ort.get_available_providers())


def test_cuda_and_dml_probes_agree_with_the_reference() -> None:
    ref = _reference()
    assert og.is_cuda_available() == ref.is_cuda_available()
    assert og.is_dml_available() == ref.is_dml_available()


def test_log_callback_sees_generate_next_token_and_a_file_takes_precedence(tmp_path) -> None:
    lines: list[str] = []
    try:
        og.set_log_options(enabled=True, generate_next_token=True, hit_eos=True)
        og.set_log_callback(lines.append)
        _gpt2_step(og)
        assert lines and lines[0].startswith("generate_next_token: next tokens [204]")
        lines.clear()
        log_file = tmp_path / "genai.log"
        og.set_log_options(filename=str(log_file))
        _gpt2_step(og)
        assert not lines and "generate_next_token" in log_file.read_text()
        og.set_log_options(filename="", enabled=False)
        _gpt2_step(og)
        assert not lines
    finally:
        og.set_log_callback(None)
        og.set_log_options(enabled=False, generate_next_token=False, hit_eos=False, filename="")


def test_log_options_reject_unknown_names_and_non_bools() -> None:
    with pytest.raises(GenaiRuntimeError, match="unknown option 'generate_next_tokens'"):
        og.set_log_options(generate_next_tokens=True)
    with pytest.raises(GenaiRuntimeError, match="enabled must be a bool"):
        og.set_log_options(enabled="yes")
    with pytest.raises(GenaiRuntimeError, match="callable or None"):
        og.set_log_callback("print")


def test_telemetry_switches_exist_like_the_reference() -> None:
    ref = _reference()
    for module in (og, ref):
        module.disable_telemetry_events()
        module.enable_telemetry_events()
        module.disable_telemetry_events()


def test_named_tensors_behave_like_the_reference() -> None:
    ref = _reference()
    values = {
        "input_ids": np.array([[0, 0, 0, 52], [0, 0, 195, 731]], dtype=np.int32),
        "test1": np.arange(4, dtype=np.float32).reshape(2, 2),
    }
    seen = []
    for module in (og, ref):
        named = module.NamedTensors()
        named["input_ids"] = values["input_ids"]
        named["test1"] = module.Tensor(values["test1"])
        keys = named.keys()
        arrays = {k: named[k].as_numpy().copy() for k in keys}
        shapes = {k: list(named[k].shape()) for k in keys}
        assert "test1" in named and "nope" not in named and len(named) == 2
        del named["nope"]  # a missing name is a no-op on both
        for k in keys:
            del named[k]
        seen.append((sorted(keys), shapes, len(named)))
        for k, v in values.items():
            np.testing.assert_array_equal(arrays[k], v)
    assert seen[0] == seen[1]
    with pytest.raises(GenaiRuntimeError, match="Tensor with name: zz not found"):
        og.NamedTensors()["zz"]


def test_tensor_copies_its_array_like_the_reference() -> None:
    ref = _reference()
    for module in (og, ref):
        array = np.arange(6, dtype=np.float32)
        tensor = module.Tensor(array)
        array[0] = 99
        assert tensor.as_numpy()[0] == 0
    with pytest.raises(GenaiRuntimeError, match="numeric array"):
        og.Tensor(np.array(["a"]))


def test_device_type_matches_the_reference() -> None:
    ref = _reference()
    path = str(require_shared("fixtures", "onnxruntime-genai", "tiny-random-gpt2-fp32"))
    assert og.Model(path).device_type == ref.Model(path).device_type == "CPU"


def test_media_loaders_reject_empty_and_missing_input(tmp_path) -> None:
    for call in (og.Images.open_bytes, og.Audios.open_bytes):
        with pytest.raises(GenaiRuntimeError, match="no"):
            call()
    for call in (og.Images.open, og.Audios.open):
        with pytest.raises(GenaiRuntimeError):
            call(tmp_path / "missing.bin")
