"""Every example config under examples/ loads, validates and routes as its README says; every
v2 example config of the reference project (../shared) loads too."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, require_shared

from genai_runtime.cli import main as cli_main
from genai_runtime.config import load
from genai_runtime.config.loader import config_version, read_document, validate_document
from genai_runtime.config.presets import available_presets
from genai_runtime.errors import ConfigError
from genai_runtime.routing import classify
from genai_runtime.spec import PipelineSpec

EXAMPLES_DIR = REPO / "examples"
SCHEMAS_DIR = REPO / "schemas"


@dataclass(frozen=True)
class Example:
    kind: str  # route kind
    reason: str  # a structural fact the route's reasons state (what ``explain`` prints)
    extends: tuple[str, ...]  # preset chain
    base: str | None = None
    config: str = "genai_config.json"
    preset_dirs: tuple[str, ...] = ()


EXAMPLES: dict[str, Example] = {
    "decoder": Example("decoder", "a single autoregressive decoder", ("autoregressive-decoder",)),
    "decoder-yaml": Example(
        "decoder",
        "a single autoregressive decoder",
        ("autoregressive-decoder",),
        config="genai_config.yaml",
    ),
    "prefill-decode": Example(
        "prefill-decode",
        "prefill runs on the prompt only; decode on new tokens only",
        ("prefill-decode",),
    ),
    "decoder-pipeline": Example(
        "decoder-pipeline",
        "stages chained by wires: embeddings.inputs_embeds -> transformer.inputs_embeds; "
        "transformer.hidden_states -> lm_head.hidden_states",
        ("decoder-pipeline",),
    ),
    "encoder-decoder": Example(
        "encoder-decoder",
        "'decoder' cross-attends to the output of 'encoder'",
        ("encoder-decoder",),
    ),
    "vlm-per-image": Example(
        "multimodal", "1 session(s) run once per input (init): vision", ("vision-language",)
    ),
    "tri-modal-single-pass": Example(
        "multimodal", "2 session(s) run once per input (init): vision, speech", ("vision-language",)
    ),
    "speech-language": Example(
        "multimodal", "1 session(s) run once per input (init): speech", ("speech-language",)
    ),
    "speculative-draft-target": Example(
        "speculative",
        "draft_model session 'draft' proposes 4 tokens, 'decoder' verifies",
        ("speculative-draft-target", "autoregressive-decoder"),
        base="decoder",
    ),
    "v1-and-v2": Example("decoder", "a single autoregressive decoder", ("autoregressive-decoder",)),
    "custom-preset": Example(
        "decoder",
        "a single autoregressive decoder",
        ("team-decoder", "autoregressive-decoder"),
        preset_dirs=("presets",),
    ),
}


def config_path(name: str) -> Path:
    return EXAMPLES_DIR / name / EXAMPLES[name].config


def load_example(name: str, config: str | None = None) -> PipelineSpec:
    example = EXAMPLES[name]
    folder = EXAMPLES_DIR / name
    dirs = [folder / d for d in example.preset_dirs]
    return load(folder / (config or example.config), preset_dirs=dirs)


def config_files() -> list[Path]:
    return sorted(
        p for p in EXAMPLES_DIR.rglob("genai_config*") if p.suffix in (".json", ".yaml", ".yml")
    )


# ------------------------------------------------------------------------------ the set


def test_every_example_folder_is_tested() -> None:
    folders = {p.name for p in EXAMPLES_DIR.iterdir() if p.is_dir()}
    assert folders == set(EXAMPLES)


def test_examples_cover_every_builtin_preset() -> None:
    used = {preset for e in EXAMPLES.values() for preset in e.extends}
    assert set(available_presets()) <= used


def test_no_onnx_files_are_committed() -> None:
    assert not [p for p in EXAMPLES_DIR.rglob("*") if ".onnx" in p.name]


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_readme_is_short_and_names_the_preset(name: str) -> None:
    text = (EXAMPLES_DIR / name / "README.md").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip()]
    assert 2 <= len(lines) <= 5
    assert EXAMPLES[name].extends[0] in text
    assert EXAMPLES[name].kind in text  # says where it routes


# ------------------------------------------------------------------------------ $schema


@pytest.mark.parametrize("path", config_files(), ids=lambda p: str(p.relative_to(EXAMPLES_DIR)))
def test_config_starts_with_schema_pointing_at_the_right_file(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    doc = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
    assert next(iter(doc)) == "$schema"
    schema = (path.parent / doc["$schema"]).resolve()
    assert schema == SCHEMAS_DIR / f"genai_config.v{config_version(doc)}.schema.json"
    assert schema.is_file()
    validate_document(doc, config_version(doc), source=str(path))


def test_yaml_example_tells_the_yaml_language_server_too() -> None:
    first = config_path("decoder-yaml").read_text(encoding="utf-8").splitlines()[0]
    assert first == "# yaml-language-server: $schema=../../schemas/genai_config.v2.schema.json"


# ------------------------------------------------------------------------------ load and route


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_loads_and_routes(name: str) -> None:
    example = EXAMPLES[name]
    spec = load_example(name)
    assert spec.extends == example.extends
    assert spec.model_dir == EXAMPLES_DIR / name
    route = classify(spec)
    assert (route.kind, route.base) == (example.kind, example.base)
    assert any(example.reason in reason for reason in route.reasons), route.reasons


def test_yaml_and_json_decoder_examples_build_the_same_spec() -> None:
    yaml_spec, json_spec = load_example("decoder-yaml"), load_example("decoder")
    differs = {
        f.name
        for f in dataclasses.fields(PipelineSpec)
        if getattr(yaml_spec, f.name) != getattr(json_spec, f.name)
    }
    assert differs == {"metadata", "model_dir"}  # a note and the folder, nothing else
    assert json_spec.generation.do_sample and json_spec.generation.top_p == 0.9


def test_v1_and_its_v2_equivalent_build_the_same_spec() -> None:
    v1 = load_example("v1-and-v2")
    v2 = load_example("v1-and-v2", "genai_config.v2.json")
    assert read_document(EXAMPLES_DIR / "v1-and-v2")[1].name == "genai_config.json"
    assert config_version(read_document(EXAMPLES_DIR / "v1-and-v2")[0]) == 1
    for field in ("sessions", "flow", "dataflow", "state", "tokens", "generation", "strategy"):
        assert getattr(v1, field) == getattr(v2, field), field
    assert v1.generation.max_length == 4096  # v1 max_length 0 -> context_length
    assert v1.tokens.eos == (2, 32007)
    assert v1.metadata["translated_from"] == "v1"


def test_custom_preset_comes_from_the_shipped_folder() -> None:
    spec = load_example("custom-preset")
    options = spec.sessions["decoder"].options
    assert (options.intra_op_num_threads, options.graph_optimization_level) == (
        4,
        "ORT_ENABLE_ALL",
    )
    assert spec.state.kv_cache.format == "separate"
    with pytest.raises(ConfigError, match="unknown preset 'team-decoder'"):
        load(EXAMPLES_DIR / "custom-preset")  # without preset_dirs it is not found


def test_vlm_example_runs_vision_per_image_with_mrope() -> None:
    spec = load_example("vlm-per-image")
    first = spec.flow[0]
    assert (first.run, first.when, first.loop) == ("vision", "init", "per_image")
    position = spec.state.position_ids
    assert (position.strategy, position.grid_source) == ("mrope_3d", "vision.image_grid_thw")
    assert [str(w) for w in spec.dataflow] == [
        "vision.image_features -> embedding.image_features",
        "embedding.inputs_embeds -> decoder.inputs_embeds",
    ]


def test_tri_modal_example_batches_both_encoders() -> None:
    spec = load_example("tri-modal-single-pass")
    assert [(s.run, s.loop) for s in spec.steps("init")] == [
        ("vision", "batched"),
        ("speech", "batched"),
    ]
    assert {w.src for w in spec.dataflow if w.dst == "embedding"} == {"vision", "speech"}


def test_encoder_decoder_example_replaces_the_presets_wire() -> None:
    spec = load_example("encoder-decoder")
    assert [str(w) for w in spec.dataflow] == [
        "encoder.last_hidden_state -> decoder.encoder_hidden_states"
    ]
    assert spec.steps("step")[0].cross_attention_from == "encoder"
    assert spec.state.cross_cache is not None and spec.state.cross_cache.source == "encoder"
    assert spec.tokens.decoder_start == 0


def test_speculative_example_keeps_the_draft_in_a_subfolder() -> None:
    spec = load_example("speculative-draft-target")
    assert spec.sessions["draft"].file == "draft/model.onnx"
    assert (spec.strategy.draft_session, spec.strategy.verify_session) == ("draft", "decoder")
    assert [s.run for s in spec.flow] == ["decoder"]


def test_prefill_decode_example_splits_the_passes() -> None:
    spec = load_example("prefill-decode")
    assert [(s.run, s.run_on_prompt, s.run_on_token_gen) for s in spec.flow] == [
        ("prefill", True, False),
        ("decode", False, True),
    ]
    assert spec.state.kv_cache.past_key_pattern == "past_key_values.%d.key"


# ------------------------------------------------------------------------------ ../shared configs

PIPELINE_CONFIG = ("examples-pipeline-config",)
SPECULATIVE = ("speculative-tiny",)
# Shared configs (under fixtures/onnxruntime-genai) -> route kind.
SHARED: dict[tuple[str, ...], str] = {
    (*PIPELINE_CONFIG, "01-preset-decoder"): "decoder",
    (*PIPELINE_CONFIG, "02-explicit-encoder-decoder"): "encoder-decoder",
    (*PIPELINE_CONFIG, "03-vlm-per-image"): "multimodal",
    (*PIPELINE_CONFIG, "04-plugin-escape-hatch"): "plugin",
    (*PIPELINE_CONFIG, "05-v1-to-v2", "v1"): "decoder",
    (*PIPELINE_CONFIG, "05-v1-to-v2", "v2"): "decoder",
    (*PIPELINE_CONFIG, "06-multimodal-single-pass"): "multimodal",
    (*PIPELINE_CONFIG, "07-prefill-decode"): "prefill-decode",
    ("pipeline-v2-decoder",): "decoder",
    ("pipeline-v2-vlm-override",): "multimodal",
    ("qwen2-5-vl-pipeline",): "multimodal",
    (*SPECULATIVE, "target"): "speculative",
    (*SPECULATIVE, "target-eagle"): "speculative",
    (*SPECULATIVE, "target-tree"): "speculative",
}


@pytest.mark.parametrize("parts", list(SHARED), ids=lambda p: "/".join(p))
def test_shared_example_config_loads(fixtures_dir: Path, parts: tuple[str, ...]) -> None:
    folder = fixtures_dir.joinpath(*parts)
    # The speculative targets name ../draft and ../target: widen the root to their parent.
    root: Any = fixtures_dir / "speculative-tiny" if parts[0] == "speculative-tiny" else None
    spec = load(folder, root=root)
    assert spec.steps("step") or spec.plugin is not None
    assert classify(spec).kind == SHARED[parts]


def test_shared_v2_configs_are_all_listed(fixtures_dir: Path) -> None:
    """Every v2 config in the fixtures is in SHARED (the v1 ones are in test_v1_translation)."""
    found = set()
    for path in fixtures_dir.rglob("genai_config.json"):
        doc = json.loads(path.read_text(encoding="utf-8-sig"))
        if config_version(doc) == 2:
            found.add(path.parent.relative_to(fixtures_dir).parts)
    assert found <= set(SHARED)


def test_shared_examples_need_their_root() -> None:
    target = require_shared("fixtures", "onnxruntime-genai", "speculative-tiny", "target")
    with pytest.raises(ConfigError, match=r"pipeline\.sessions\.draft\.file"):
        load(target)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_validates_and_explains_through_the_cli(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``genai-runtime validate`` and ``explain`` on each example (configs only: no ONNX here)."""
    example = EXAMPLES[name]
    path = str(EXAMPLES_DIR / name / example.config)
    presets = [a for d in example.preset_dirs for a in ("--presets", str(EXAMPLES_DIR / name / d))]
    assert cli_main(["validate", path, "--config-only", *presets]) == 0
    assert f"route {example.kind}" in capsys.readouterr().out
    assert cli_main(["explain", path, "--config-only", *presets]) == 0
    report = capsys.readouterr().out
    assert f"route: {example.kind}" in report
    assert example.reason in report
