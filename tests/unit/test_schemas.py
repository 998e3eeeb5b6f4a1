"""The v1/v2 JSON Schemas: well-formed, accept every real config we have, reject bad ones."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from genai_runtime.config.loader import (
    config_version,
    load_schema,
    schema_path,
    validate_document,
)
from genai_runtime.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

# Small, self-contained configs in both formats (shapes copied from the builder's output).
V1: dict[str, Any] = {
    "model": {
        "type": "llama",
        "bos_token_id": 1,
        "eos_token_id": [2, 3],
        "pad_token_id": 2,
        "vocab_size": 49152,
        "context_length": 8192,
        "decoder": {
            "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
            "filename": "model.onnx",
            "head_size": 64,
            "hidden_size": 576,
            "num_attention_heads": 9,
            "num_hidden_layers": 2,
            "num_key_value_heads": 3,
            "inputs": {
                "input_ids": "input_ids",
                "attention_mask": "attention_mask",
                "past_key_names": "past_key_values.%d.key",
                "past_value_names": "past_key_values.%d.value",
            },
            "outputs": {
                "logits": "logits",
                "present_key_names": "present.%d.key",
                "present_value_names": "present.%d.value",
            },
            "pipeline": [
                {
                    "embeddings": {
                        "filename": "embeds.onnx",
                        "inputs": ["input_ids"],
                        "outputs": ["inputs_embeds"],
                    }
                }
            ],
        },
    },
    "search": {"max_length": 8192, "top_k": 50, "top_p": 1.0, "do_sample": False},
}

V2: dict[str, Any] = {
    "version": 2,
    "pipeline": {
        "extends": "vision-language",
        "sessions": {
            "vision": {"file": "vision.onnx"},
            "embedding": {"file": "embedding.onnx"},
            "decoder": {"file": "decoder.onnx"},
        },
        "flow": [
            {"run": "vision", "when": "init", "loop": "per_image"},
            {"run": "embedding", "when": "init"},
            {"run": "decoder", "when": "step"},
        ],
        "dataflow": [{"from": "embedding.inputs_embeds", "to": "decoder.inputs_embeds"}],
        "state": {"position_ids": {"strategy": "mrope_3d", "grid_source": "vision.grid"}},
    },
    "tokens": {"eos": [151645], "pad": 0, "image_token": 151655},
    "generation": {"max_length": 4096, "sampling": {"temperature": 0.7}},
    "metadata": {"model_type": "qwen2_5_vl"},
}


def _validator(version: int) -> Draft202012Validator:
    return Draft202012Validator(load_schema(version))


def _problems(doc: dict, version: int) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        validate_document(doc, version)
    return [(p.path, p.message) for p in info.value.problems]


def _mutated(base: dict, path: list[str | int], value: Any) -> dict:
    doc = copy.deepcopy(base)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


# ------------------------------------------------------------------------------ the schemas


@pytest.mark.parametrize("version", [1, 2])
def test_schema_is_valid_draft_2020_12(version: int) -> None:
    schema = load_schema(version)
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].endswith(f"genai_config.v{version}.schema.json")
    assert schema["title"] and schema["description"]


def _properties_without_description(node: Any, where: str = "") -> list[str]:
    missing = []
    if isinstance(node, dict):
        for name, sub in node.get("properties", {}).items():
            if isinstance(sub, dict) and "description" not in sub and "$ref" not in sub:
                missing.append(f"{where}.{name}")
        for key, sub in node.items():
            if key != "if":  # a condition, not something an editor completes
                missing += _properties_without_description(sub, f"{where}/{key}")
    elif isinstance(node, list):
        for i, sub in enumerate(node):
            missing += _properties_without_description(sub, f"{where}[{i}]")
    return missing


@pytest.mark.parametrize("version", [1, 2])
def test_every_property_is_described_for_editors(version: int) -> None:
    # A $ref'd property is described by its definition (every $defs entry used as one has one).
    assert _properties_without_description(load_schema(version)) == []


def test_v2_shares_v1_definitions_unchanged() -> None:
    v1, v2 = load_schema(1)["$defs"], load_schema(2)["$defs"]
    assert {name: v2[name] for name in v1} == v1


def test_schema_files_are_found_in_the_package_data() -> None:
    assert schema_path(1).is_file() and schema_path(2).is_file()
    assert json.loads((REPO / "schemas" / "genai_config.v1.schema.json").read_text()) == (
        load_schema(1)
    )


# ------------------------------------------------------------------------------ real configs


def test_every_shared_fixture_config_validates(fixtures_dir: Path) -> None:
    files = sorted(fixtures_dir.rglob("genai_config.json"))
    assert len(files) >= 20
    failures = {}
    for file in files:
        doc = json.loads(file.read_text(encoding="utf-8"))
        try:
            validate_document(doc, config_version(doc), source=str(file))
        except ConfigError as exc:
            failures[str(file.relative_to(fixtures_dir))] = str(exc)
    assert failures == {}


def test_both_real_models_validate(smollm2_dir: Path, smollm2_2layers_dir: Path) -> None:
    for folder in (smollm2_dir, smollm2_2layers_dir):
        doc = json.loads((folder / "genai_config.json").read_text(encoding="utf-8"))
        assert config_version(doc) == 1
        validate_document(doc, 1)


def test_builtin_presets_fit_the_v2_pipeline_definition() -> None:
    schema = load_schema(2)
    pipeline = Draft202012Validator({"$defs": schema["$defs"], "$ref": "#/$defs/pipeline"})
    presets = sorted((REPO / "presets").glob("*.json"))
    assert presets
    for preset in presets:
        errors = list(pipeline.iter_errors(json.loads(preset.read_text())["pipeline"]))
        assert errors == [], preset.name


@pytest.mark.parametrize(("doc", "version"), [(V1, 1), (V2, 2)])
def test_sample_configs_validate(doc: dict, version: int) -> None:
    validate_document(doc, version)


# ------------------------------------------------------------------------------ accepted


def test_unknown_session_option_strings_and_provider_options_are_accepted() -> None:
    options = {
        "session.use_device_allocator_for_initializers": "0",
        "ep.context_enable": "1",
        "graph_optimization_level": "ORT_ENABLE_ALL",
        "intra_op_num_threads": 4,
        "provider_options": [
            {},
            {"cuda": {"enable_cuda_graph": "1", "any_future_option": "x"}},
            {
                "QNN": {
                    "backend_path": "QnnHtp.dll",
                    "device_filtering_options": {"hardware_device_type": "NPU"},
                }
            },
        ],
    }
    validate_document(_mutated(V1, ["model", "decoder", "session_options"], options), 1)
    v2 = _mutated(V2, ["pipeline", "sessions", "decoder", "session_options"], options)
    validate_document(v2, 2)


def test_v2_session_runtime_and_build_requires_are_accepted() -> None:
    options = {
        "runtime": {
            "intra_op_num_threads": 2,
            "graph_optimization_level": "ORT_ENABLE_BASIC",
            "execution_mode": "parallel",
            "enable_mem_pattern": False,
            "log_severity_level": 3,
        },
        "build_requires": {
            "onnxruntime": ">=1.20, <2",
            "providers": ["CPUExecutionProvider"],
        },
    }
    validate_document(
        _mutated(V2, ["pipeline", "sessions", "decoder", "session_options"], options), 2
    )


def test_integral_floats_count_as_integers_like_the_reference() -> None:
    validate_document(_mutated(V1, ["search", "top_k"], 3.0), 1)


def test_top_level_scalars_are_ignored_in_v1_like_the_reference() -> None:
    doc = {**V1, "$schema": "./genai_config.v1.schema.json", "comment": "ok", "version": 1}
    validate_document(doc, 1)


def test_v2_may_carry_v1_model_search_and_speculative_blocks() -> None:
    doc = {**V2, "model": V1["model"], "search": V1["search"], "speculative": {"ngram_size": 3}}
    validate_document(doc, 2)


def test_v2_free_form_places_accept_anything() -> None:
    doc = copy.deepcopy(V2)
    doc["metadata"] = {"anything": [1, {"x": None}]}
    doc["pipeline"]["strategy"] = {
        "kind": "speculative",
        "draft": {"producer": "ngram", "ngram_size": 3, "custom": [1]},
        "tree": {"medusa_choices": [[0], [0, 1]]},
    }
    doc["pipeline"]["controller"] = {"module": "ctl.py", "factory": "make", "params": {"k": 1}}
    doc["generation"]["logits"] = [{"op": "repetition_penalty", "penalty": 1.1}]
    doc["tokens"]["video_token"] = 151656
    validate_document(doc, 2)


# ------------------------------------------------------------------------------ rejected

NEGATIVE = [
    # (id, version, path to set, value, expected problem path, words in the message)
    ("wrong-type", 1, ["search", "top_k"], "5", "search.top_k", ["expected an integer", '"5"']),
    ("fraction", 1, ["search", "top_k"], 1.5, "search.top_k", ["integer >= 0", "1.5"]),
    ("below-min", 1, ["search", "top_k"], -1, "search.top_k", [">= 0", "-1"]),
    ("top-p", 1, ["search", "top_p"], 1.5, "search.top_p", ["between 0 and 1", "1.5"]),
    ("beams", 1, ["search", "num_beams"], 0, "search.num_beams", ["between 1 and 4096", "0"]),
    ("temp", 1, ["search", "temperature"], -0.5, "search.temperature", [">= 0", "-0.5"]),
    ("penalty", 1, ["search", "repetition_penalty"], 0, "search.repetition_penalty", ["> 0"]),
    ("bool", 1, ["search", "do_sample"], "yes", "search.do_sample", ["boolean", '"yes"']),
    ("int32", 1, ["search", "top_k"], 2**40, "search.top_k", ["2147483647"]),
    ("context", 1, ["model", "context_length"], 0, "model.context_length", ["between 1 and"]),
    (
        "draft-tokens",
        1,
        ["speculative"],
        {"max_draft_tokens": 17},
        "speculative.max_draft_tokens",
        ["between 1 and 16", "17"],
    ),
    (
        "ngram",
        1,
        ["speculative"],
        {"ngram_size": 1},
        "speculative.ngram_size",
        ["0 or an integer between 2 and 16", "got 1"],
    ),
    ("eos", 1, ["model", "eos_token_id"], "x", "model.eos_token_id", ["integer >= 0 or an array"]),
    ("eos-item", 1, ["model", "eos_token_id", 1], None, "model.eos_token_id[1]", ["null"]),
    ("unknown-top", 1, ["extra"], {}, "extra", ["unknown key 'extra'", "model, search"]),
    ("unknown-top-v2", 2, ["extra"], 1, "extra", ["unknown key 'extra'", "pipeline"]),
    ("unknown-model", 1, ["model", "foo"], 1, "model.foo", ["unknown key 'foo'", "vocab_size"]),
    (
        "unknown-decoder",
        1,
        ["model", "decoder", "foo"],
        1,
        "model.decoder.foo",
        ["unknown key 'foo'", "expected one of: ", "filename, head_size"],
    ),
    (
        "typo",
        1,
        ["model", "decoder", "filenme"],
        "x",
        "model.decoder.filenme",
        ["did you mean 'filename'?"],
    ),
    ("unknown-search", 1, ["search", "topk"], 1, "search.topk", ["did you mean 'top_k'?"]),
    (
        "unknown-input-role",
        1,
        ["model", "decoder", "inputs", "tokens"],
        "x",
        "model.decoder.inputs.tokens",
        ["unknown key 'tokens'", "input_ids"],
    ),
    (
        "session-option-object",
        1,
        ["model", "decoder", "session_options", "weird"],
        {},
        "model.decoder.session_options.weird",
        ["unknown key 'weird'", "provider_options", "must hold a string"],
    ),
    (
        "session-option-number",
        1,
        ["model", "decoder", "session_options", "session.x"],
        1,
        'model.decoder.session_options["session.x"]',
        ["expected a string", "got 1"],
    ),
    (
        "graph-opt",
        1,
        ["model", "decoder", "session_options", "graph_optimization_level"],
        "ALL",
        "model.decoder.session_options.graph_optimization_level",
        ["one of 'ORT_DISABLE_ALL'", "'ALL'"],
    ),
    (
        "provider-option-number",
        1,
        ["model", "decoder", "session_options", "provider_options"],
        [{"cuda": {"device_id": 0}}],
        "model.decoder.session_options.provider_options[0].cuda.device_id",
        ["expected a string", "got 0"],
    ),
    (
        "run-options",
        1,
        ["model", "decoder", "run_options"],
        {"a": True},
        "model.decoder.run_options.a",
        ["expected a string", "boolean true"],
    ),
    (
        "stage-type",
        1,
        ["model", "decoder", "pipeline", 0, "embeddings", "filename"],
        5,
        "model.decoder.pipeline[0].embeddings.filename",
        ["expected a string", "got 5"],
    ),
    (
        "stage-unknown",
        1,
        ["model", "decoder", "pipeline", 0, "embeddings", "is_head"],
        True,
        "model.decoder.pipeline[0].embeddings.is_head",
        ["unknown key 'is_head'", "is_lm_head"],
    ),
    (
        "pipeline-shape",
        1,
        ["model", "decoder", "pipeline"],
        "x",
        "model.decoder.pipeline",
        ["an array of objects or an object", '"x"'],
    ),
    (
        "alignment",
        1,
        ["model", "decoder", "sliding_window"],
        {"alignment": "middle"},
        "model.decoder.sliding_window.alignment",
        ["one of 'left', 'right'", "'middle'"],
    ),
    ("v1-version", 1, ["version"], 2, "version", ["expected 1", "got 2"]),
    ("v2-version", 2, ["version"], 3, "version", ["expected 2", "got 3"]),
    (
        "session-unknown",
        2,
        ["pipeline", "sessions", "decoder", "filename"],
        "x",
        "pipeline.sessions.decoder.filename",
        ["unknown key 'filename'", "file, inputs"],
    ),
    (
        "session-dot",
        2,
        ["pipeline", "sessions", "dec.oder"],
        {"file": "x.onnx"},
        'pipeline.sessions["dec.oder"]',
        ["invalid name 'dec.oder'", "no dots"],
    ),
    (
        "session-shape",
        2,
        ["pipeline", "sessions", "vision"],
        [],
        "pipeline.sessions.vision",
        ["expected an object", "array []"],
    ),
    (
        "flow-unknown",
        2,
        ["pipeline", "flow", 1, "after"],
        "vision",
        "pipeline.flow[1].after",
        ["unknown key 'after'", "run, run_on_prompt"],
    ),
    (
        "flow-when",
        2,
        ["pipeline", "flow", 1, "when"],
        "sometimes",
        "pipeline.flow[1].when",
        ["expected one of 'init', 'step', 'final', got 'sometimes'"],
    ),
    (
        "flow-run",
        2,
        ["pipeline", "flow", 0],
        {"when": "init"},
        "pipeline.flow[0]",
        ["missing required key 'run'"],
    ),
    (
        "wire-format",
        2,
        ["pipeline", "dataflow", 0, "from"],
        "embedding",
        "pipeline.dataflow[0].from",
        ['"session.tensor"', "'embedding'"],
    ),
    (
        "runtime-enum",
        2,
        ["pipeline", "sessions", "decoder", "session_options"],
        {"runtime": {"execution_mode": "threads"}},
        "pipeline.sessions.decoder.session_options.runtime.execution_mode",
        ["'sequential', 'parallel'", "'threads'"],
    ),
    (
        "runtime-unknown",
        2,
        ["pipeline", "sessions", "decoder", "session_options"],
        {"runtime": {"threads": 2}},
        "pipeline.sessions.decoder.session_options.runtime.threads",
        ["unknown key 'threads'"],
    ),
    (
        "build-requires",
        2,
        ["pipeline", "sessions", "decoder", "session_options"],
        {"build_requires": {"onnxruntime": "1.20"}},
        "pipeline.sessions.decoder.session_options.build_requires.onnxruntime",
        ["version specifier", "'1.20'"],
    ),
    (
        "unknown-requirement",
        2,
        ["pipeline", "sessions", "decoder", "session_options"],
        {"build_requires": {"opsets": {"ai.onnx": 21}}},
        "pipeline.sessions.decoder.session_options.build_requires.opsets",
        ["unknown key"],
    ),
    (
        "kv-format",
        2,
        ["pipeline", "state"],
        {"kv_cache": {"format": "mixed"}},
        "pipeline.state.kv_cache.format",
        ["'separate', 'combined'"],
    ),
    (
        "strategy-tokens",
        2,
        ["pipeline", "strategy"],
        {"kind": "speculative", "num_speculative_tokens": 0},
        "pipeline.strategy.num_speculative_tokens",
        ["between 1 and 16"],
    ),
    (
        "producer",
        2,
        ["pipeline", "strategy"],
        {"draft": {"producer": "oracle"}},
        "pipeline.strategy.draft.producer",
        ["'draft_model', 'ngram', 'hidden_state', 'eagle'", "'oracle'"],
    ),
    ("max-stages", 2, ["pipeline", "max_stages"], 0, "pipeline.max_stages", [">= 1"]),
    (
        "token-extra",
        2,
        ["tokens", "image_token"],
        "x",
        "tokens.image_token",
        ["expected an integer"],
    ),
    (
        "min-p",
        2,
        ["generation", "sampling", "min_p"],
        2,
        "generation.sampling.min_p",
        ["between 0 and 1"],
    ),
    ("gen-unknown", 2, ["generation", "beams"], 2, "generation.beams", ["unknown key 'beams'"]),
    (
        "logits-op",
        2,
        ["generation", "logits"],
        [{"p": 1}],
        "generation.logits[0]",
        ["missing required key 'op'"],
    ),
    ("stop", 2, ["generation", "stop"], ["a", 1], "generation.stop[1]", ["expected a string"]),
]


@pytest.mark.parametrize(
    ("version", "path", "value", "where", "words"),
    [case[1:] for case in NEGATIVE],
    ids=[case[0] for case in NEGATIVE],
)
def test_bad_value_is_reported_at_its_path(
    version: int, path: list, value: Any, where: str, words: list[str]
) -> None:
    doc = _mutated(V1 if version == 1 else V2, path, value)
    problems = _problems(doc, version)
    assert [p for p, _ in problems] == [where], problems
    message = problems[0][1]
    for word in words:
        assert word in message


@pytest.mark.parametrize(
    ("version", "remove", "where", "key"),
    [
        (1, ["model", "decoder"], "model", "decoder"),
        (1, ["model", "context_length"], "model", "context_length"),
        (1, ["model"], "", "model"),
        (2, ["version"], "", "version"),
    ],
)
def test_missing_required_key(version: int, remove: list[str], where: str, key: str) -> None:
    doc = copy.deepcopy(V1 if version == 1 else V2)
    node = doc
    for part in remove[:-1]:
        node = node[part]
    del node[remove[-1]]
    assert _problems(doc, version) == [(where, f"missing required key '{key}'")]


def test_rnnt_models_need_no_context_length_like_the_reference() -> None:
    doc = copy.deepcopy(V1)
    doc["model"]["type"] = "nemotron_speech"
    del doc["model"]["context_length"]
    validate_document(doc, 1)


def test_v2_schema_lists_every_cache_kind() -> None:
    from genai_runtime.kv import CACHE_KINDS

    kind = load_schema(2)["$defs"]
    found = [d["properties"]["kind"] for d in kind.values() if "kind" in d.get("properties", {})]
    listed = {k for entry in found for k in entry.get("examples", [])}
    assert set(CACHE_KINDS) | {"auto"} <= listed
