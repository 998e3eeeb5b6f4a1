"""Sessions are built from the config's session_options: typed options, free-form config
entries, providers and build requirements reach onnxruntime, or fail with a clear error."""

from __future__ import annotations

import json

import onnxruntime as ort
import pytest
from conftest import require_shared

import genai_runtime as og


def _config(overlay: dict | None = None) -> og.Config:
    config = og.Config(require_shared("models", "smollm2-135m-instruct-int4-2layers"))
    if overlay:
        config.overlay(json.dumps(overlay))
    return config


def _decoder_options(**options) -> dict:
    return {"model": {"decoder": {"session_options": options}}}


def test_typed_options_and_config_entries_reach_onnxruntime() -> None:
    config = _config(
        _decoder_options(
            intra_op_num_threads=1,
            graph_optimization_level="ORT_ENABLE_BASIC",
            enable_mem_pattern=False,
            **{"session.intra_op.allow_spinning": "0"},
        )
    )
    options = og.Model(config).sessions["decoder"].get_session_options()
    assert options.intra_op_num_threads == 1
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert options.enable_mem_pattern is False
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_overlay_is_validated_and_a_bad_one_leaves_the_config_as_it_was() -> None:
    config = _config()
    with pytest.raises(og.ConfigError, match=r"search\.max_length: expected an integer"):
        config.overlay(json.dumps({"search": {"max_length": "long"}}))
    config.overlay(json.dumps({"search": {"max_length": 77}}))
    assert config.spec.generation.max_length == 77


def test_unavailable_provider_is_a_clear_error() -> None:
    config = _config()
    config.clear_providers()
    config.append_provider("cuda")
    with pytest.raises(og.UnsupportedError, match=r"'cuda' \(CUDAExecutionProvider\).*available"):
        og.Model(config)


def test_clear_providers_runs_on_cpu() -> None:
    config = _config(_decoder_options(provider_options=[{"cuda": {"device_id": "0"}}]))
    config.clear_providers()
    model = og.Model(config)
    assert model.sessions["decoder"].get_providers() == ["CPUExecutionProvider"]


def _write_v2_decoder(folder, session_options: dict) -> None:
    """A v2 config extending the decoder preset, its one session with these options."""
    doc = {
        "version": 2,
        "pipeline": {
            "extends": "autoregressive-decoder",
            "sessions": {"decoder": {"file": "model.onnx", "session_options": session_options}},
            # The graph leaves the head size symbolic ('kv_cache_dim'): the config states it.
            "state": {"kv_cache": {"head_size": 64}},
        },
        "tokens": {"eos": [2], "pad": 2},
        "generation": {"max_length": 32},
    }
    (folder / "genai_config.json").write_text(json.dumps(doc))


def test_build_requires_is_checked_before_loading(tmp_path) -> None:
    _write_v2_decoder(tmp_path, {"build_requires": {"onnxruntime": ">=99.0"}})
    with pytest.raises(og.UnsupportedError, match=r"needs onnxruntime >=99\.0"):
        og.Model(tmp_path)


def test_v2_runtime_options_are_applied(tmp_path) -> None:
    source = require_shared("models", "smollm2-135m-instruct-int4-2layers")
    for name in ("model.onnx", "model.onnx.data"):
        (tmp_path / name).write_bytes((source / name).read_bytes())  # copies, not hard links
    runtime = {"intra_op_num_threads": 1, "execution_mode": "sequential"}
    _write_v2_decoder(tmp_path, {"runtime": runtime, "build_requires": {"onnxruntime": ">=1.20"}})
    model = og.Model(tmp_path)
    assert model.sessions["decoder"].get_session_options().intra_op_num_threads == 1
    generator = og.Generator(model, og.GeneratorParams(model))
    generator.append_tokens([504, 1398, 282])
    generator.generate_next_token()
    assert generator.token_count() == 4


def _stops_spinning(session: ort.InferenceSession) -> str | None:
    try:
        return session.get_session_options().get_session_config_entry("session.force_spinning_stop")
    except RuntimeError:  # onnxruntime raises for an entry that was never set
        return None


def test_sessions_that_take_turns_on_every_token_park_their_threads(tmp_path) -> None:
    """Three sessions per token (the pipeline fixture) each get force_spinning_stop, so one's
    spinning workers do not take the cores the next needs; a lone decoder does not; a value
    the config sets wins."""
    pipeline = og.Model(require_shared("fixtures", "onnxruntime-genai", "pipeline-model-tiny"))
    assert pipeline.takes_turns and len(pipeline.sessions) == 3
    assert {_stops_spinning(s) for s in pipeline.sessions.values()} == {"1"}
    single = og.Model(_config())
    assert not single.takes_turns and _stops_spinning(single.sessions["decoder"]) is None
    # A draft model beside the target: both the target's and the draft's sessions park.
    draft = _config({"model": {"draft": {"filename": "model.onnx"}}})
    speculative = og.Model(draft)
    assert speculative.takes_turns
    assert _stops_spinning(speculative.sessions["decoder"]) == "1"
    draft_sessions = speculative.speculative.source.draft.sessions
    assert {_stops_spinning(s) for s in draft_sessions.values()} == {"1"}
    chosen = og.Model(_config(_decoder_options(**{"session.force_spinning_stop": "0"})))
    assert _stops_spinning(chosen.sessions["decoder"]) == "0"
