"""Per-stage execution providers: each session of a v2 config names its own
(``pipeline.sessions.NAME.session_options.provider_options``), e.g. the encoder on OpenVINO and
the decoder on the CPU; ``explain`` shows the providers each stage got and how many nodes each
took.

Runs everywhere (the CI venv has neither torch nor OpenVINO): a tiny encoder-decoder built with
``onnx.helper`` whose encoder asks for onnxruntime's Azure provider (in the CPU wheel; it takes no
node, so explain shows every node on the CPU), and the clear error for an OpenVINO stage where
``onnxruntime-openvino`` is absent.

Runs where onnxruntime has ``OpenVINOExecutionProvider`` (``pip install -e ".[openvino]"``, then
the swap in docs/guide/devices.md): the tiny encoder-decoder with its encoder on OpenVINO, a node
OpenVINO lacks falling back to the CPU, and the Windows ML T5 export (``benchmarks/
winml_export.py``) with the encoder on OpenVINO and the decoder on the CPU, and with both on
OpenVINO, each against the all-CPU folder and PyTorch's ``generate``. The T5 folders need torch
to write; in a venv with onnxruntime-openvino and no torch, write them in one with torch and pass
the folder in ``GENAI_RUNTIME_WINML_EXPORTS``::

    .venv/bin/python benchmarks/winml_export.py tiny /tmp/wx     # where torch is
    GENAI_RUNTIME_WINML_EXPORTS=/tmp/wx OV/bin/python -m pytest tests/kv/test_stage_providers.py
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import genai_runtime as og
from genai_runtime.cli import main as cli_main
from genai_runtime.explain import explain_model, format_report, providers_text
from genai_runtime.runtime.sessions import create_session
from genai_runtime.session.device import Device, install_hint
from genai_runtime.session.providers import assignment
from genai_runtime.spec import ProviderSpec, SessionOptionsSpec, SessionSpec
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

REPO = Path(__file__).resolve().parents[2]
CPU = "CPUExecutionProvider"
OPENVINO = "OpenVINOExecutionProvider"
AZURE = "AzureExecutionProvider"
AVAILABLE = ort.get_available_providers()
HAS_OPENVINO = OPENVINO in AVAILABLE
NEEDS_OPENVINO = pytest.mark.skipif(
    not HAS_OPENVINO,
    reason=f"needs onnxruntime with {OPENVINO} (this one has {', '.join(AVAILABLE)}): "
    "onnxruntime-openvino, see docs/guide/devices.md",
)
EXPORTS_ENV = "GENAI_RUNTIME_WINML_EXPORTS"
ATOL = 1e-3
VOCAB, HIDDEN = 16, 8


# -- a tiny encoder-decoder, no torch --------------------------------------------------------------


def _encoder_decoder(root: Path, encoder: str = "cpu", decoder: str = "cpu") -> Path:
    """encoder: ids -> tanh(table[ids]); decoder: logits = (embed[ids] + mean(encoder states))
    @ w, its KV passed through. ``encoder`` / ``decoder``: each session's provider."""
    rng = np.random.default_rng(5)
    ids = helper.make_tensor_value_info("input_ids", INT64, ["batch", "source"])
    mask = helper.make_tensor_value_info("attention_mask", INT64, ["batch", "source"])
    last = helper.make_tensor_value_info("last_hidden_state", FLOAT, ["batch", "source", HIDDEN])
    table = rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["embedded"]),
        helper.make_node("Tanh", ["embedded"], ["last_hidden_state"]),
    ]
    init = [numpy_helper.from_array(table, "table")]
    save_graph(helper.make_graph(nodes, "enc", [ids, mask], [last], init), root / "encoder.onnx")
    ids = helper.make_tensor_value_info("input_ids", INT64, ["batch", "seq"])
    states = helper.make_tensor_value_info(
        "encoder_hidden_states", FLOAT, ["batch", "source", HIDDEN]
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
        numpy_helper.from_array(rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32), "embed"),
        numpy_helper.from_array(rng.standard_normal((HIDDEN, VOCAB)).astype(np.float32), "w"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
    ]
    graph = helper.make_graph(nodes, "dec", [ids, states, mask, *kv_in], [logits, *kv_out], init)
    save_graph(graph, root / "decoder.onnx")

    def session(name: str, provider: str) -> dict:
        entry: dict = {"file": f"{name}.onnx"}
        if provider != "cpu":
            entry["session_options"] = {"provider_options": [{provider: {}}]}
        return entry

    doc = {
        "version": 2,
        "pipeline": {
            "extends": "encoder-decoder",
            "sessions": {
                "encoder": session("encoder", encoder),
                "decoder": session("decoder", decoder),
            },
            "dataflow": [
                {"from": "encoder.last_hidden_state", "to": "decoder.encoder_hidden_states"}
            ],
        },
        "tokens": {"bos": 0, "eos": [15], "pad": 0, "decoder_start": 0},
        "generation": {"max_length": 12},
    }
    return write_config(root, doc)


def _greedy(model: og.Model, prompt: list[int]) -> list[int]:
    generator = og.Generator(model, og.GeneratorParams(model))
    generator.append_tokens(np.array([prompt], np.int64))
    while not generator.is_done():
        generator.generate_next_token()
    return generator.get_sequence(0).tolist()


def _stages(model: og.Model) -> dict[str, dict]:
    return {s["session"]: s for s in explain_model(model)["graphs"]["stages"]}


@pytest.mark.skipif(AZURE not in AVAILABLE, reason=f"this onnxruntime has no {AZURE}")
def test_each_stage_runs_on_its_own_providers_and_explain_shows_them(tmp_path: Path) -> None:
    """The encoder asks for Azure's provider, the decoder for none (the CPU's): the encoder's
    session has both and Azure took no node; the decoder's has only the CPU's."""
    model = og.Model(str(_encoder_decoder(tmp_path / "azure", encoder=AZURE)))
    assert model.sessions["encoder"].get_providers() == [AZURE, CPU]
    assert model.sessions["decoder"].get_providers() == [CPU]
    stages = _stages(model)
    encoder, decoder = stages["encoder"]["providers"], stages["decoder"]["providers"]
    assert [p["name"] for p in encoder] == [AZURE, CPU]
    assert encoder[0]["nodes"] == 0 and encoder[1]["nodes"] == 2  # Gather, Tanh
    assert decoder == [{"name": CPU}]  # a CPU-only session: nothing to record
    assert stages["encoder"]["device"] == "cpu"  # its memory is the host's
    text = format_report(explain_model(model))
    assert f"providers: {CPU} (all 2 nodes; none on {AZURE})" in text
    assert f"providers: {CPU}\n" in text
    assert explain_model(model)["sessions"]["encoder"]["providers"] == [AZURE]  # as configured
    all_cpu = og.Model(str(_encoder_decoder(tmp_path / "cpu")))
    assert _greedy(model, [3, 7, 1]) == _greedy(all_cpu, [3, 7, 1])


@pytest.mark.skipif(HAS_OPENVINO, reason="this onnxruntime has the OpenVINO provider")
def test_an_openvino_stage_without_onnxruntime_openvino_is_a_clear_error(
    tmp_path: Path, capsys
) -> None:
    folder = _encoder_decoder(tmp_path, encoder="openvino")
    with pytest.raises(og.GenaiRuntimeError) as raised:
        og.Model(str(folder))
    message = str(raised.value)
    assert isinstance(raised.value, og.UnsupportedError)
    assert message.startswith("pipeline.sessions.encoder: execution provider 'openvino'")
    assert OPENVINO in message and "install onnxruntime-openvino" in message
    assert cli_main(["validate", str(folder)]) == 1
    err = capsys.readouterr().err
    assert "pipeline.sessions.encoder" in err and "onnxruntime-openvino" in err
    assert cli_main(["explain", str(folder)]) == 0  # the config is shown; the graphs are not
    out = capsys.readouterr().out
    assert "encoder: file encoder.onnx" in out and "providers openvino" in out
    assert "graphs: not inspected (pipeline.sessions.encoder" in out
    assert "onnxruntime-openvino" in out


def test_the_install_hint_names_the_package_and_a_wheel_that_replaced_it() -> None:
    cpu_wheel = [CPU]
    assert install_hint(OPENVINO, lambda name: name == "onnxruntime", cpu_wheel) == (
        "install onnxruntime-openvino in place of onnxruntime"
    )
    both = install_hint(OPENVINO, lambda name: True, cpu_wheel)  # onnxruntime's files won
    assert both.startswith("onnxruntime-openvino is installed, but so is onnxruntime")
    assert "pip uninstall -y onnxruntime" in both
    assert "pip install --force-reinstall --no-deps onnxruntime-openvino" in both
    # The provider is listed (its wheel's files won) but failed to start: not this message.
    listed = install_hint(OPENVINO, lambda name: True, [OPENVINO, CPU])
    assert listed == "install onnxruntime-openvino in place of onnxruntime"
    assert install_hint("NoSuchExecutionProvider") == ""


def test_providers_text() -> None:
    assert providers_text([{"name": CPU}]) == CPU
    split = [{"name": OPENVINO, "nodes": 1, "parts": 1}, {"name": CPU, "nodes": 2, "parts": 2}]
    assert providers_text(split) == (
        f"{OPENVINO} 1 nodes, {CPU} 2 nodes (a partition: the graph is split between them)"
    )


# -- OpenVINO -------------------------------------------------------------------------------------


@NEEDS_OPENVINO
def test_tiny_encoder_on_openvino_decoder_on_cpu(tmp_path: Path) -> None:
    model = og.Model(str(_encoder_decoder(tmp_path / "ov", encoder="openvino")))
    stages = _stages(model)
    assert stages["encoder"]["providers"][0] == {"name": OPENVINO, "nodes": 2, "parts": 1}
    assert stages["encoder"]["device"] == "cpu"
    assert stages["decoder"]["providers"] == [{"name": CPU}]
    all_cpu = og.Model(str(_encoder_decoder(tmp_path / "cpu")))
    for prompt in ([3, 7, 1], [9, 2, 2, 5, 11]):
        assert _greedy(model, prompt) == _greedy(all_cpu, prompt)


@NEEDS_OPENVINO
def test_a_node_openvino_lacks_runs_on_the_cpu_and_explain_says_so(tmp_path: Path) -> None:
    """OpenVINO has no Det: onnxruntime partitions the graph, the Det on the CPU provider."""
    x = helper.make_tensor_value_info("x", FLOAT, [3, 3])
    y = helper.make_tensor_value_info("y", FLOAT, [])
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Det", ["a"], ["b"]),
        helper.make_node("Relu", ["b"], ["y"]),
    ]
    path = save_graph(helper.make_graph(nodes, "det", [x], [y]), tmp_path / "det.onnx")
    options = SessionOptionsSpec(
        providers=(ProviderSpec("openvino"),),
        graph_optimization_level="ORT_DISABLE_ALL",
    )
    session = create_session(SessionSpec("det", "det.onnx", options), path, tmp_path)
    assigned = {a.provider: a.nodes for a in assignment(session)}
    assert assigned[CPU] >= 1 and assigned[OPENVINO] >= 1 and sum(assigned.values()) == 3
    text = providers_text([{"name": a.provider, "nodes": a.nodes, "parts": a.parts}
                           for a in assignment(session)])  # fmt: skip
    assert "a partition" in text and OPENVINO in text and CPU in text
    a = np.array([[2, 0, 0], [0, 3, 0], [0, 0, 4]], np.float32)
    assert np.isclose(session.run(None, {"x": a})[0], 24.0)


# -- the Windows ML T5 export: encoder on OpenVINO ------------------------------------------------


def _export_module():
    spec = importlib.util.spec_from_file_location(
        "winml_export", REPO / "benchmarks/winml_export.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def t5(tmp_path_factory) -> Path:
    """A folder as ``winml_export.py tiny`` writes it (t5-static and t5-reference.npz): from
    ``GENAI_RUNTIME_WINML_EXPORTS``, else written here (torch and transformers)."""
    if not HAS_OPENVINO:
        pytest.skip(f"needs onnxruntime with {OPENVINO}; see docs/guide/devices.md")
    module = _export_module()
    given = os.environ.get(EXPORTS_ENV)
    if given:
        root = Path(given)
        for need in ("t5-static/genai_config.json", module.REFERENCE):
            assert (root / need).is_file(), f"{EXPORTS_ENV}={given}: no {need} there"
        return root
    reason = (
        f"the T5 export needs torch and transformers: write it with "
        f"`python benchmarks/winml_export.py tiny DIR` where they are and set {EXPORTS_ENV}=DIR"
    )
    pytest.importorskip("torch", reason=reason)
    pytest.importorskip("transformers", reason=reason)
    root = tmp_path_factory.mktemp("winml-stages")
    module.export_t5(module.tiny_t5(root / "checkpoint-t5"), root / "t5-static")
    module.write_t5_reference(root, module.T5_PROMPTS, module.T5_STEPS)
    return root


def _run(model: og.Model, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """Greedy tokens after the prompt and each step's logits [steps, V] (batch 1)."""
    generator = og.Generator(model, og.GeneratorParams(model))
    generator.append_tokens(np.array([prompt], np.int64))
    logits = []
    for _ in range(steps):
        logits.append(generator.get_logits()[0, 0].copy())
        generator.generate_next_token()
        if generator.is_done():
            break
    return generator.get_sequence(0)[len(prompt) :].tolist(), np.stack(logits)


@NEEDS_OPENVINO
@pytest.mark.parametrize(
    "encoder, decoder",
    [("openvino", "cpu"), ("openvino", "openvino")],
    ids=["encoder-openvino", "both-openvino"],
)
def test_t5_export_on_openvino_equals_all_cpu_and_pytorch(
    t5: Path, tmp_path: Path, capsys, encoder: str, decoder: str
) -> None:
    """The decoder's graph writes its new row with ScatterElements (index_copy): OpenVINO takes
    it too, every node of both graphs on OpenVINO."""
    module = _export_module()
    folder = module.with_providers(t5 / "t5-static", tmp_path / "t5", encoder, decoder)
    prompts, steps, ref_tokens, ref_logits = module.read_t5_reference(t5)
    model, all_cpu = og.Model(str(folder)), og.Model(str(t5 / "t5-static"))
    stages = _stages(model)
    for name, provider in (("encoder", encoder), ("decoder", decoder)):
        got = stages[name]["providers"]
        if provider == "openvino":
            assert got[0]["name"] == OPENVINO and got[0]["nodes"] > 0
            assert all(p["nodes"] == 0 for p in got[1:])  # no node fell back to the CPU
        else:
            assert got == [{"name": CPU}]
        assert Device.of(model.sessions[name]).host
    generator = og.Generator(model, og.GeneratorParams(model))
    assert generator.kv_plan.kind == "static-index-copy"  # rows written by host code
    for prompt, tokens, logits in zip(prompts, ref_tokens, ref_logits):
        ours, our_logits = _run(model, prompt, steps)
        cpu, cpu_logits = _run(all_cpu, prompt, steps)
        assert ours == cpu == tokens
        np.testing.assert_allclose(our_logits, cpu_logits, atol=ATOL, rtol=0)
        np.testing.assert_allclose(our_logits, logits[: len(our_logits)], atol=ATOL, rtol=0)
    assert cli_main(["explain", str(folder)]) == 0
    out = capsys.readouterr().out
    assert f"providers: {OPENVINO} (all " in out
    if decoder == "cpu":
        assert f"providers: {CPU}\n" in out
