"""Config vs. real graph I/O, checked once at load: wires, renamed roles and KV names.

Tiny ONNX models (tests/tiny_models.py) are written to tmp_path and loaded by onnxruntime; every
mismatch must be a ModelError naming the file and the tensor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest
import tiny_models
from tiny_models import write_config

from genai_runtime.config import load
from genai_runtime.errors import ConfigError, ModelError
from genai_runtime.model import Model
from genai_runtime.runtime.plan import build_plan, graph_problems
from genai_runtime.session.graph_io import SessionIO


def pipeline_config(**pipeline: Any) -> dict[str, Any]:
    """The decoder-pipeline preset (embeds.onnx -> transformer.onnx -> lm_head.onnx)."""
    return {
        "version": 2,
        "pipeline": {"extends": "decoder-pipeline", **pipeline},
        "tokens": {"eos": [15], "pad": 0},
        "generation": {"max_length": 32},
    }


def decoder_config(**pipeline: Any) -> dict[str, Any]:
    return {
        "version": 2,
        "pipeline": {"extends": "autoregressive-decoder", **pipeline},
        "generation": {"max_length": 32},
    }


def model_error(folder: Path) -> str:
    with pytest.raises(ModelError) as info:
        Model(folder)
    return str(info.value)


def ios_of(folder: Path) -> dict[str, SessionIO]:
    """Each session's real I/O, read with a plain onnxruntime session."""
    spec = load(folder)
    out = {}
    for name, session in spec.sessions.items():
        sess = ort.InferenceSession(str(folder / session.file), providers=["CPUExecutionProvider"])
        out[name] = SessionIO.of(sess, session.file)
    return out


@pytest.fixture
def pipeline_dir(tmp_path: Path) -> Path:
    return write_config(tiny_models.pipeline_folder(tmp_path / "pipe"), pipeline_config())


@pytest.fixture
def decoder_dir(tmp_path: Path) -> Path:
    tiny_models.decoder(tmp_path / "dec" / "model.onnx")
    return tmp_path / "dec"


# ------------------------------------------------------------------------------ 3-stage pipeline


def test_three_stage_pipeline_wires_are_bound_to_real_tensors(pipeline_dir: Path) -> None:
    model = Model(pipeline_dir)
    assert model.route.kind == "decoder-pipeline"
    assert graph_problems(model.spec, model.ios) == []
    embeddings, transformer, lm_head = model.plan.stages
    assert [s.name for s in model.plan.stages] == ["embeddings", "transformer", "lm_head"]
    assert [(f.name, f.source) for f in embeddings.feeds] == [("input_ids", "role")]
    assert str(transformer.feeds_from("wire")[0].wire) == (
        "embeddings.inputs_embeds -> transformer.inputs_embeds"
    )
    assert {f.name for f in transformer.feeds_from("kv")} == {
        "past_key_values.0.key",
        "past_key_values.0.value",
    }
    assert [(f.name, f.source) for f in lm_head.feeds] == [("hidden_states", "wire")]
    assert embeddings.wire_outputs == ("inputs_embeds",)
    assert transformer.wire_outputs == ("hidden_states",)
    assert lm_head.logits is not None and model.vocab_size == tiny_models.VOCAB
    layout = model.plan.layout
    assert (layout.file, layout.num_kv_heads, layout.head_size) == (
        "transformer.onnx",
        tiny_models.HEADS,
        tiny_models.HEAD_SIZE,
    )


def test_wire_to_an_input_the_graph_lacks(pipeline_dir: Path) -> None:
    dataflow = [
        {"from": "embeddings.inputs_embeds", "to": "transformer.embeds"},
        {"from": "transformer.hidden_states", "to": "lm_head.hidden_states"},
    ]
    write_config(pipeline_dir, pipeline_config(dataflow=dataflow))
    message = model_error(pipeline_dir)
    assert "pipeline.dataflow[0]" in message
    assert "transformer.onnx has no input 'embeds'" in message
    assert "inputs: inputs_embeds, attention_mask" in message  # lists what there is


def test_wire_from_an_output_the_graph_lacks(pipeline_dir: Path) -> None:
    dataflow = [
        {"from": "embeddings.inputs_embeds", "to": "transformer.inputs_embeds"},
        {"from": "transformer.last_hidden", "to": "lm_head.hidden_states"},
    ]
    write_config(pipeline_dir, pipeline_config(dataflow=dataflow))
    message = model_error(pipeline_dir)
    assert "pipeline.dataflow[1]" in message
    assert "transformer.onnx has no output 'last_hidden'" in message


def test_wire_dtype_mismatch(tmp_path: Path) -> None:
    folder = tiny_models.pipeline_folder(tmp_path, embeds_dtype=tiny_models.FLOAT16)
    message = model_error(write_config(folder, pipeline_config()))
    assert "embeddings.inputs_embeds -> transformer.inputs_embeds" in message
    assert "embeds.onnx gives tensor(float16), transformer.onnx expects tensor(float)" in message


def test_several_mismatches_are_reported_together(pipeline_dir: Path) -> None:
    dataflow = [
        {"from": "embeddings.embeds", "to": "transformer.inputs_embeds"},
        {"from": "transformer.hidden_states", "to": "lm_head.h"},
    ]
    write_config(pipeline_dir, pipeline_config(dataflow=dataflow))
    assert len(graph_problems(load(pipeline_dir), ios_of(pipeline_dir))) == 2
    with pytest.raises(ModelError, match="2 config/graph mismatches"):
        build_plan(load(pipeline_dir), ios_of(pipeline_dir))


def test_pipeline_with_renamed_tensors_binds_them(tmp_path: Path) -> None:
    """Wires carry whatever names the graphs use (dots and slashes included)."""
    gather = "/model/embed_tokens/Gather/output_0"
    tiny_models.embeddings(tmp_path / "embeds.onnx", output=gather)
    tiny_models.transformer(tmp_path / "transformer.onnx", input=gather, output="h.out")
    tiny_models.lm_head(tmp_path / "lm_head.onnx", input="h.out")
    dataflow = [
        {"from": f"embeddings.{gather}", "to": f"transformer.{gather}"},
        {"from": "transformer.h.out", "to": "lm_head.h.out"},
    ]
    model = Model(write_config(tmp_path, pipeline_config(dataflow=dataflow)))
    wired = [str(f.wire) for stage in model.plan.stages for f in stage.feeds_from("wire")]
    assert wired == [
        f"embeddings.{gather} -> transformer.{gather}",
        "transformer.h.out -> lm_head.h.out",
    ]


# ------------------------------------------------------------------------------ roles and KV


def test_tiny_decoder_loads(decoder_dir: Path) -> None:
    model = Model(write_config(decoder_dir, decoder_config()))
    assert model.route.kind == "decoder"
    assert model.plan.layout.past == (("past_key_values.0.key", "past_key_values.0.value"),)
    [stage] = model.plan.stages
    assert {f.name: f.source for f in stage.feeds}["attention_mask"] == "role"


def test_renamed_attention_mask_the_graph_lacks(decoder_dir: Path) -> None:
    sessions = {"decoder": {"file": "model.onnx", "inputs": {"attention_mask": "attn_mask"}}}
    message = model_error(write_config(decoder_dir, decoder_config(sessions=sessions)))
    assert "model.onnx" in message
    assert "'attention_mask' to 'attn_mask'" in message
    assert "pipeline.sessions.decoder.inputs.attention_mask" in message


def test_renamed_attention_mask_the_graph_has(tmp_path: Path) -> None:
    tiny_models.decoder(tmp_path / "model.onnx", mask_name="attn_mask")
    sessions = {"decoder": {"file": "model.onnx", "inputs": {"attention_mask": "attn_mask"}}}
    model = Model(write_config(tmp_path, decoder_config(sessions=sessions)))
    feeds = {f.name: f for f in model.plan.stages[0].feeds}
    assert (feeds["attn_mask"].source, feeds["attn_mask"].role) == ("role", "attention_mask")


def test_renamed_logits_output_the_graph_lacks(decoder_dir: Path) -> None:
    sessions = {"decoder": {"file": "model.onnx", "outputs": {"logits": "scores"}}}
    message = model_error(write_config(decoder_dir, decoder_config(sessions=sessions)))
    assert "model.onnx" in message and "'logits' to 'scores'" in message


def test_configured_kv_pattern_absent_from_the_graph(decoder_dir: Path) -> None:
    kv = {
        "past_key_pattern": "cache.%d.k",
        "past_value_pattern": "cache.%d.v",
        "present_key_pattern": "new_cache.%d.k",
        "present_value_pattern": "new_cache.%d.v",
    }
    message = model_error(write_config(decoder_dir, decoder_config(state={"kv_cache": kv})))
    assert "model.onnx" in message
    assert "'cache.0.k'" in message and "pattern 'cache.%d.k'" in message


def test_configured_present_pattern_absent_from_the_graph(decoder_dir: Path) -> None:
    kv = {
        "past_key_pattern": "past_key_values.%d.key",
        "past_value_pattern": "past_key_values.%d.value",
        "present_key_pattern": "updated.%d.key",
        "present_value_pattern": "updated.%d.value",
    }
    message = model_error(write_config(decoder_dir, decoder_config(state={"kv_cache": kv})))
    assert "model.onnx" in message and "'updated.0.key'" in message


def test_kv_num_layers_disagreeing_with_the_graph(tmp_path: Path) -> None:
    tiny_models.decoder(tmp_path / "model.onnx", layers=2)
    folder = write_config(tmp_path, decoder_config(state={"kv_cache": {"num_layers": 3}}))
    message = model_error(folder)
    assert "model.onnx" in message
    assert "the config says 3 layers but the graph declares 2" in message


def test_kv_heads_disagreeing_with_the_graph(decoder_dir: Path) -> None:
    folder = write_config(decoder_dir, decoder_config(state={"kv_cache": {"num_kv_heads": 5}}))
    message = model_error(folder)
    assert "model.onnx" in message and "num_kv_heads 2 but the config says 5" in message


def test_matching_kv_dims_load(tmp_path: Path) -> None:
    tiny_models.decoder(tmp_path / "model.onnx", layers=2)
    kv = {"num_layers": 2, "num_kv_heads": tiny_models.HEADS, "head_size": tiny_models.HEAD_SIZE}
    model = Model(write_config(tmp_path, decoder_config(state={"kv_cache": kv})))
    assert len(model.plan.layout.past) == 2


# ------------------------------------------------------------------------------ shared fixture


def test_pipeline_model_tiny_fixture_loads(fixtures_dir: Path) -> None:
    model = Model(fixtures_dir / "pipeline-model-tiny")
    assert model.route.kind == "decoder-pipeline"
    assert [s.name for s in model.plan.stages] == [
        "embeddings",
        "transformer",
        "language_model_head",
    ]
    assert graph_problems(model.spec, model.ios) == []
    sources = {f.name: f.source for s in model.plan.stages for f in s.feeds}
    assert sources["/model/embed_tokens/Gather/output_0"] == "wire"
    assert sources["hidden_states"] == "wire"
    assert sources["past_key_values.0.key"] == "kv"
    assert "user" not in sources.values()  # every input has a source the runtime owns
    assert model.vocab_size == 16


def test_kv_pattern_without_layer_index_is_a_config_error(tmp_path: Path) -> None:
    """A pattern with no %d names one tensor for every layer: refused, not looped over."""
    folder = tmp_path / "m"
    tiny_models.decoder(folder / "model.onnx")  # one layer: past_key_values.0.key, ...
    doc = {
        "model": {
            "type": "x",
            "context_length": 16,
            "decoder": {
                "filename": "model.onnx",
                "inputs": {
                    "past_key_names": "past_key_values.0.key",
                    "past_value_names": "past_key_values.0.value",
                },
                "outputs": {
                    "present_key_names": "present.0.key",
                    "present_value_names": "present.0.value",
                },
            },
        }
    }
    tiny_models.write_config(folder, doc)
    with pytest.raises(ConfigError, match="has no %d"):
        Model(folder)
