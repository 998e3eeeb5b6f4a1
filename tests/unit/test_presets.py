"""Presets: ``pipeline.extends`` fills what a config omits (replace, don't merge lists)."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from genai_runtime.config import load
from genai_runtime.config.build import build_spec
from genai_runtime.config.flow import check_flow
from genai_runtime.config.loader import validate_document
from genai_runtime.config.presets import available_presets, builtin_presets_dir, resolve_presets
from genai_runtime.errors import ConfigError
from genai_runtime.routing import classify
from genai_runtime.spec import PipelineSpec

BUILTIN = {
    "autoregressive-decoder": "decoder",
    "decoder-pipeline": "decoder-pipeline",
    "encoder-decoder": "encoder-decoder",
    "prefill-decode": "prefill-decode",
    "speculative-draft-target": "speculative",
    "speech-language": "multimodal",
    "vision-language": "multimodal",
}


def v2(pipeline: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"version": 2, "pipeline": pipeline, **top}


def resolved(doc: dict[str, Any], dirs: Sequence[Path] = ()) -> tuple[dict[str, Any], list[str]]:
    out, chain = resolve_presets(doc, list(dirs))
    validate_document(out, 2)
    return out, chain


def spec_of(doc: dict[str, Any], dirs: Sequence[Path] = ()) -> PipelineSpec:
    out, chain = resolved(doc, dirs)
    spec = build_spec(out, None, chain)
    check_flow(spec)
    return spec


def write_preset(folder: Path, name: str, pipeline: dict[str, Any], extends: str | None = None):
    body: dict[str, Any] = {"description": f"test preset {name}", "pipeline": pipeline}
    if extends:
        body["extends"] = extends
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(body), encoding="utf-8")


def error(call, *args, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        call(*args, **kwargs)
    return info.value


# ------------------------------------------------------------------------------ built-in presets


def test_builtin_presets_are_the_documented_ones() -> None:
    assert set(BUILTIN) <= set(available_presets())
    assert all(p.parent == builtin_presets_dir() for p in available_presets().values())


@pytest.mark.parametrize("name", sorted(available_presets()))
def test_every_builtin_preset_resolves_validates_and_checks(name: str) -> None:
    spec = spec_of(v2({"extends": name}))
    assert spec.extends[0] == name
    assert spec.sessions and spec.steps("step")
    if name in BUILTIN:
        assert classify(spec).kind == BUILTIN[name]


def test_builtin_preset_files_are_well_formed() -> None:
    for name, path in available_presets().items():
        data = json.loads(path.read_text(encoding="utf-8"))
        assert set(data) <= {"description", "extends", "pipeline"}, name
        assert data["description"].strip(), name
        assert "extends" not in data["pipeline"], f"{name}: chain with top-level 'extends'"


def test_builtin_preset_extending_another_resolves_the_chain() -> None:
    spec = spec_of(v2({"extends": "speculative-draft-target"}))
    assert spec.extends == ("speculative-draft-target", "autoregressive-decoder")
    assert [s.run for s in spec.flow] == ["decoder"]  # from autoregressive-decoder
    assert spec.sessions["draft"].file == "draft/model.onnx"  # from speculative-draft-target
    assert spec.state.kv_cache.kind == "auto"


# ------------------------------------------------------------------------------ merge rules


def test_omitted_flow_and_dataflow_are_inherited() -> None:
    spec = spec_of(v2({"extends": "vision-language"}))
    assert [(s.run, s.when, s.loop) for s in spec.flow] == [
        ("vision", "init", "per_image"),
        ("embedding", "step", None),
        ("decoder", "step", None),
    ]
    assert [str(w) for w in spec.dataflow] == [
        "vision.image_features -> embedding.image_features",
        "embedding.inputs_embeds -> decoder.inputs_embeds",
    ]


def test_explicit_flow_replaces_the_presets_and_dataflow_is_inherited() -> None:
    flow = [
        {"run": "vision", "when": "init", "loop": "batched"},
        {"run": "embedding", "when": "init"},
        {"run": "decoder", "when": "step"},
    ]
    spec = spec_of(v2({"extends": "vision-language", "flow": flow}))
    assert [(s.run, s.when, s.loop) for s in spec.flow] == [
        ("vision", "init", "batched"),
        ("embedding", "init", None),
        ("decoder", "step", None),
    ]
    assert len(spec.dataflow) == 2  # the preset's wires, untouched


def test_explicit_dataflow_replaces_the_presets_and_flow_is_inherited() -> None:
    dataflow = [{"from": "encoder.last_hidden_state", "to": "decoder.encoder_out"}]
    spec = spec_of(v2({"extends": "encoder-decoder", "dataflow": dataflow}))
    assert [str(w) for w in spec.dataflow] == ["encoder.last_hidden_state -> decoder.encoder_out"]
    assert [s.cross_attention_from for s in spec.flow] == [None, "encoder"]


def test_an_empty_explicit_dataflow_replaces_too() -> None:
    spec = spec_of(v2({"extends": "decoder-pipeline", "dataflow": []}))
    assert spec.dataflow == ()


def test_sessions_merge_by_name() -> None:
    sessions = {
        "decoder": {"file": "text.onnx", "session_options": {"intra_op_num_threads": 2}},
        "extra": {"file": "extra.onnx"},
    }
    spec = spec_of(v2({"extends": "vision-language", "sessions": sessions}))
    assert {n: s.file for n, s in spec.sessions.items()} == {
        "vision": "vision.onnx",
        "embedding": "embedding.onnx",
        "decoder": "text.onnx",
        "extra": "extra.onnx",
    }
    assert spec.sessions["decoder"].options.intra_op_num_threads == 2


def test_state_merges_key_by_key() -> None:
    state = {"position_ids": {"strategy": "mrope_3d", "grid_source": "vision.image_grid_thw"}}
    spec = spec_of(v2({"extends": "vision-language", "state": state}))
    assert spec.state.position_ids.strategy == "mrope_3d"
    assert spec.state.kv_cache.kind == "auto"  # kept from the preset


def test_strategy_and_roles_replace_the_presets() -> None:
    strategy = {"kind": "speculative", "draft": {"producer": "ngram", "ngram_size": 3}}
    spec = spec_of(v2({"extends": "speculative-draft-target", "strategy": strategy}))
    assert (spec.strategy.producer, spec.strategy.draft_session) == ("ngram", None)
    assert spec.strategy.verify_session is None  # not merged in from the preset's verify block


def test_resolution_does_not_modify_its_input() -> None:
    doc = v2({"extends": "decoder-pipeline", "sessions": {"lm_head": {"file": "head.onnx"}}})
    before = copy.deepcopy(doc)
    out, _ = resolve_presets(doc)
    assert doc == before
    out["pipeline"]["sessions"]["lm_head"]["file"] = "changed.onnx"
    assert doc == before
    assert resolve_presets(doc)[0]["pipeline"]["sessions"]["lm_head"]["file"] == "head.onnx"


def test_document_without_extends_is_returned_as_is() -> None:
    doc = v2({"sessions": {"d": {"file": "m.onnx"}}, "flow": [{"run": "d"}]})
    assert resolve_presets(doc) == (doc, [])


# ------------------------------------------------------------------------------ user presets


def test_user_preset_folder_shadows_a_builtin(tmp_path: Path) -> None:
    write_preset(
        tmp_path,
        "autoregressive-decoder",
        {"sessions": {"decoder": {"file": "ours.onnx"}}, "flow": [{"run": "decoder"}]},
    )
    assert available_presets([tmp_path])["autoregressive-decoder"].parent == tmp_path
    doc = v2({"extends": "autoregressive-decoder"})
    assert spec_of(doc, [tmp_path]).sessions["decoder"].file == "ours.onnx"
    assert spec_of(doc).sessions["decoder"].file == "model.onnx"


def test_user_preset_extends_a_builtin_and_nearest_wins(tmp_path: Path) -> None:
    write_preset(
        tmp_path,
        "my-vlm",
        {
            "sessions": {"vision": {"file": "siglip.onnx"}},
            "state": {"kv_cache": {"kind": "concat"}},
        },
        extends="vision-language",
    )
    spec = spec_of(
        v2({"extends": "my-vlm", "sessions": {"decoder": {"file": "lm.onnx"}}}), [tmp_path]
    )
    assert spec.extends == ("my-vlm", "vision-language")
    assert {n: s.file for n, s in spec.sessions.items()} == {
        "vision": "siglip.onnx",  # my-vlm over vision-language
        "embedding": "embedding.onnx",  # vision-language
        "decoder": "lm.onnx",  # the config over both
    }
    assert spec.state.kv_cache.kind == "concat"
    assert spec.state.position_ids.strategy == "default"


def test_user_presets_chain_through_several_folders(tmp_path: Path) -> None:
    write_preset(
        tmp_path / "a", "base", {"sessions": {"d": {"file": "m.onnx"}}, "flow": [{"run": "d"}]}
    )
    write_preset(tmp_path / "b", "child", {"sessions": {"d": {"file": "c.onnx"}}}, extends="base")
    spec = spec_of(v2({"extends": "child"}), [tmp_path / "b", tmp_path / "a"])
    assert spec.extends == ("child", "base")
    assert spec.sessions["d"].file == "c.onnx"


def test_load_uses_preset_dirs(tmp_path: Path) -> None:
    write_preset(
        tmp_path / "presets",
        "team",
        {"sessions": {"decoder": {"file": "t.onnx"}}},
        "autoregressive-decoder",
    )
    (tmp_path / "genai_config.json").write_text(json.dumps(v2({"extends": "team"})))
    spec = load(tmp_path, preset_dirs=[tmp_path / "presets"])
    assert spec.extends == ("team", "autoregressive-decoder")
    assert spec.sessions["decoder"].file == "t.onnx"


# ------------------------------------------------------------------------------ errors


def test_unknown_preset_lists_the_available_names(tmp_path: Path) -> None:
    write_preset(tmp_path, "mine", {"flow": []})
    exc = error(resolve_presets, v2({"extends": "autoregresive-decoder"}), [tmp_path])
    [problem] = exc.problems
    assert problem.path == "pipeline.extends"
    assert "unknown preset 'autoregresive-decoder'" in problem.message
    for name in [*BUILTIN, "mine"]:
        assert name in problem.message


def test_unknown_preset_through_load_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "genai_config.json").write_text(json.dumps(v2({"extends": "nope"})))
    exc = error(load, tmp_path)
    assert exc.problems[0].path == "pipeline.extends"
    assert "autoregressive-decoder" in str(exc)


def test_preset_cycle_is_reported_as_the_cycle(tmp_path: Path) -> None:
    write_preset(tmp_path, "ping", {"flow": []}, extends="pong")
    write_preset(tmp_path, "pong", {"flow": []}, extends="ping")
    exc = error(resolve_presets, v2({"extends": "ping"}), [tmp_path])
    assert "preset cycle: ping -> pong -> ping" in str(exc)


def test_preset_extending_itself_is_a_cycle(tmp_path: Path) -> None:
    write_preset(tmp_path, "loop", {"flow": []}, extends="loop")
    exc = error(resolve_presets, v2({"extends": "loop"}), [tmp_path])
    assert "preset cycle: loop -> loop" in str(exc)


def test_unknown_preset_deeper_in_a_chain_names_the_preset_file(tmp_path: Path) -> None:
    write_preset(tmp_path, "child", {"flow": []}, extends="missing-parent")
    exc = error(resolve_presets, v2({"extends": "child"}), [tmp_path])
    assert exc.problems[0].path == "preset child.json: extends"
    assert "unknown preset 'missing-parent'" in exc.problems[0].message


def test_unreadable_preset_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("{not json")
    exc = error(resolve_presets, v2({"extends": "broken"}), [tmp_path])
    assert "preset 'broken' unreadable" in str(exc)
