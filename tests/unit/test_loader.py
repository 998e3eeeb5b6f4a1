"""The config loader: finding, reading (JSON/YAML), versions, overlays and error reporting."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from genai_runtime.config.loader import (
    LoadedDocument,
    config_version,
    deep_merge,
    find_config_file,
    json_path,
    load_document,
    read_document,
    validate_document,
)
from genai_runtime.errors import ConfigError

MODEL: dict[str, Any] = {
    "model": {
        "type": "gpt2",
        "bos_token_id": 98,
        "eos_token_id": 98,
        "pad_token_id": 98,
        "vocab_size": 1000,
        "context_length": 512,
        "decoder": {
            "session_options": {"provider_options": []},
            "filename": "model.onnx",
            "num_key_value_heads": 4,
            "head_size": 8,
            "num_hidden_layers": 5,
            "inputs": {"past_names": "past_%d"},
            "outputs": {"present_names": "present_%d"},
        },
    },
    "search": {"max_length": 512, "top_k": 1},
}


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def _error(call, *args, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        call(*args, **kwargs)
    return info.value


# ------------------------------------------------------------------------------ finding files


def test_folder_prefers_json_then_yaml(tmp_path: Path) -> None:
    yml = _write(tmp_path, "genai_config.yml", "version: 2\n")
    assert find_config_file(tmp_path) == yml
    yaml_file = _write(tmp_path, "genai_config.yaml", "version: 2\n")
    assert find_config_file(tmp_path) == yaml_file
    json_file = _write(tmp_path, "genai_config.json", "{}")
    assert find_config_file(str(tmp_path)) == json_file


def test_file_path_is_used_as_is(tmp_path: Path) -> None:
    path = _write(tmp_path, "custom.json", "{}")
    assert find_config_file(path) == path


def test_empty_folder_names_what_was_looked_for(tmp_path: Path) -> None:
    message = str(_error(find_config_file, tmp_path))
    for name in ("genai_config.json", "genai_config.yaml", "genai_config.yml", str(tmp_path)):
        assert name in message


def test_missing_path(tmp_path: Path) -> None:
    assert "does not exist" in str(_error(find_config_file, tmp_path / "nope"))


# ------------------------------------------------------------------------------ reading


def test_json_syntax_error_gives_file_line_and_column(tmp_path: Path) -> None:
    path = _write(tmp_path, "genai_config.json", '{\n  "model": {\n    "type": "x",,\n  }\n}\n')
    error = _error(read_document, tmp_path)
    assert error.source == str(path)
    assert str(path) in str(error)
    assert "line 3, column 17" in str(error)


def test_non_finite_numbers_are_rejected(tmp_path: Path) -> None:
    _write(tmp_path, "genai_config.json", '{"search": {"top_p": NaN}}')
    assert "NaN" in str(_error(read_document, tmp_path))


@pytest.mark.parametrize("text", ["[1, 2]", '"model"', "null"])
def test_top_level_must_be_an_object(tmp_path: Path, text: str) -> None:
    _write(tmp_path, "genai_config.json", text)
    assert "expected an object at the top level" in str(_error(read_document, tmp_path))


def test_byte_order_mark_is_tolerated(tmp_path: Path) -> None:
    (tmp_path / "genai_config.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(MODEL).encode())
    doc, _ = read_document(tmp_path)
    assert doc == MODEL


def test_yaml_config_loads_like_json(tmp_path: Path) -> None:
    path = _write(tmp_path, "genai_config.yaml", yaml.safe_dump(MODEL))
    loaded = load_document(tmp_path)
    assert loaded == LoadedDocument(doc=MODEL, version=1, path=path, model_dir=tmp_path)


def test_yaml_syntax_error_gives_line(tmp_path: Path) -> None:
    _write(tmp_path, "genai_config.yml", "model:\n  type: [gpt2\nsearch: {}\n")
    message = str(_error(read_document, tmp_path))
    assert "invalid YAML" in message and "line" in message


def test_yaml_is_loaded_safely(tmp_path: Path) -> None:
    _write(tmp_path, "genai_config.yaml", "model: !!python/object/apply:os.getcwd []\n")
    assert "invalid YAML" in str(_error(read_document, tmp_path))


def test_yaml_non_string_keys_are_rejected(tmp_path: Path) -> None:
    _write(tmp_path, "genai_config.yaml", "version: 2\ntokens:\n  1: 5\n")
    error = _error(read_document, tmp_path)
    assert [(p.path, p.message) for p in error.problems] == [
        ("tokens", "keys must be strings, got 1")
    ]


# ------------------------------------------------------------------------------ versions


@pytest.mark.parametrize(("doc", "version"), [({}, 1), ({"version": 1}, 1), ({"version": 2.0}, 2)])
def test_config_version(doc: dict, version: int) -> None:
    assert config_version(doc) == version


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (3, ["unsupported config version 3", "1, 2"]),
        (0, ["unsupported config version 0"]),
        ("2", ['string "2"', "1, 2"]),
        (True, ["boolean true"]),
        (None, ["null"]),
    ],
)
def test_bad_version_is_reported_at_version(value: Any, words: list[str]) -> None:
    error = _error(config_version, {"version": value})
    assert [p.path for p in error.problems] == ["version"]
    for word in words:
        assert word in error.problems[0].message


def test_version_3_file_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "genai_config.json", '{"version": 3}')
    error = _error(load_document, tmp_path)
    assert error.source == str(path)
    assert str(error).startswith(f"invalid config {path}: version: unsupported config version 3")


# ------------------------------------------------------------------------------ merging


def test_deep_merge_merges_objects_and_replaces_the_rest() -> None:
    base = {"a": {"b": 1, "c": [1, 2], "d": {"e": 1}}, "f": 1}
    overlay = {"a": {"c": [3], "d": {"g": 2}}, "f": {"x": 1}, "h": None}
    assert deep_merge(base, overlay) == {
        "a": {"b": 1, "c": [3], "d": {"e": 1, "g": 2}},
        "f": {"x": 1},
        "h": None,
    }


def test_deep_merge_is_pure() -> None:
    base = {"a": {"b": [1]}}
    overlay = {"a": {"c": {"d": [2]}}}
    before = copy.deepcopy((base, overlay))
    merged = deep_merge(base, overlay)
    merged["a"]["b"].append(9)
    merged["a"]["c"]["d"].append(9)
    assert (base, overlay) == before


# ------------------------------------------------------------------------------ loading


def test_load_document_returns_doc_version_and_folders(tmp_path: Path) -> None:
    path = _write(tmp_path / "m", "genai_config.json", json.dumps(MODEL))
    loaded = load_document(tmp_path / "m")
    assert (loaded.doc, loaded.version, loaded.path, loaded.model_dir) == (
        MODEL,
        1,
        path,
        tmp_path / "m",
    )


@pytest.mark.parametrize("as_text", [False, True])
def test_overlay_is_merged_before_validation(tmp_path: Path, as_text: bool) -> None:
    _write(tmp_path, "genai_config.json", json.dumps(MODEL))
    overlay: Any = {"search": {"top_k": 40, "do_sample": True}, "model": {"eos_token_id": [1, 2]}}
    loaded = load_document(tmp_path, json.dumps(overlay) if as_text else overlay)
    assert loaded.doc["search"] == {"max_length": 512, "top_k": 40, "do_sample": True}
    assert loaded.doc["model"]["eos_token_id"] == [1, 2]
    assert loaded.doc["model"]["decoder"] == MODEL["model"]["decoder"]


def test_overlay_errors_are_reported_like_file_errors(tmp_path: Path) -> None:
    path = _write(tmp_path, "genai_config.json", json.dumps(MODEL))
    error = _error(load_document, tmp_path, {"search": {"top_k": -3}})
    assert error.source == str(path)
    assert [(p.path, p.message) for p in error.problems] == [
        ("search.top_k", "expected an integer >= 0, got -3")
    ]


@pytest.mark.parametrize(("overlay", "words"), [('{"search": ', "line 1"), ("[1]", "an object")])
def test_malformed_overlay(tmp_path: Path, overlay: str, words: str) -> None:
    _write(tmp_path, "genai_config.json", json.dumps(MODEL))
    error = _error(load_document, tmp_path, overlay)
    assert error.source == "config overlay"
    assert words in str(error)


def test_empty_overlay_string_is_no_overlay(tmp_path: Path) -> None:
    _write(tmp_path, "genai_config.json", json.dumps(MODEL))
    assert load_document(tmp_path, "").doc == MODEL


def test_all_problems_are_reported_at_once_sorted_by_path(tmp_path: Path) -> None:
    doc = copy.deepcopy(MODEL)
    doc["search"].update(top_k="5", top_p=2, num_beams=0, bogus=1)
    doc["model"]["decoder"]["inputs"]["pasts"] = "x"
    doc["model"]["context_length"] = 1.5
    del doc["model"]["decoder"]["filename"]  # optional: not a problem
    path = _write(tmp_path, "genai_config.json", json.dumps(doc))
    error = _error(load_document, tmp_path)
    assert [p.path for p in error.problems] == [
        "model.context_length",
        "model.decoder.inputs.pasts",
        "search.bogus",
        "search.num_beams",
        "search.top_k",
        "search.top_p",
    ]
    text = str(error)
    assert text.startswith(f"invalid config {path} (6 problems):\n  - model.context_length: ")
    assert 'search.top_k: expected an integer, got string "5"' in text


def test_real_model_folder_loads(smollm2_dir: Path) -> None:
    loaded = load_document(smollm2_dir, '{"search": {"max_length": 64}}')
    assert loaded.version == 1
    assert loaded.model_dir == smollm2_dir
    assert loaded.doc["search"]["max_length"] == 64


def test_mixed_v2_fixture_loads(fixtures_dir: Path, tmp_path: Path) -> None:
    source = fixtures_dir / "speculative-tiny" / "target" / "genai_config.json"
    shutil.copy(source, tmp_path / "genai_config.json")
    loaded = load_document(tmp_path)
    assert loaded.version == 2
    assert {"model", "search", "pipeline"} <= set(loaded.doc)


def test_json_path_quotes_keys_that_are_not_words() -> None:
    assert json_path([]) == ""
    assert json_path(["model", "decoder", "pipeline", 0, "embeddings"]) == (
        "model.decoder.pipeline[0].embeddings"
    )
    assert json_path(["session_options", "session.x", "a b"]) == (
        'session_options["session.x"]["a b"]'
    )


# ------------------------------------------------------------------------------ property test

# Configs whose numeric fields are all typed by the schema (metadata and other free-form
# places are skipped below).
_SAMPLES = [
    ("models", "smollm2-135m-instruct-int4"),
    ("fixtures", "onnxruntime-genai", "qwen2-5-vl-pipeline"),
    ("fixtures", "onnxruntime-genai", "examples-pipeline-config", "07-prefill-decode"),
    ("fixtures", "onnxruntime-genai", "examples-pipeline-config", "06-multimodal-single-pass"),
    ("fixtures", "onnxruntime-genai", "speculative-tiny", "target"),
]
_FREE_FORM = {"metadata", "tree", "params"}


def _numeric_leaves(node: Any, parts: tuple = ()) -> list[tuple]:
    if isinstance(node, dict):
        return [
            leaf
            for key, value in node.items()
            if key not in _FREE_FORM
            for leaf in _numeric_leaves(value, (*parts, key))
        ]
    if isinstance(node, list):
        return [leaf for i, v in enumerate(node) for leaf in _numeric_leaves(v, (*parts, i))]
    if isinstance(node, int | float) and not isinstance(node, bool):
        return [parts]
    return []


@pytest.fixture(scope="module")
def numeric_fields(shared_dir: Path) -> list[tuple[dict, tuple]]:
    fields = []
    for parts in _SAMPLES:
        doc = json.loads((shared_dir.joinpath(*parts) / "genai_config.json").read_text())
        fields += [(doc, leaf) for leaf in _numeric_leaves(doc)]
    assert len(fields) > 50
    return fields


_WRONG_TYPES = st.one_of(
    st.text(max_size=8),
    st.booleans(),
    st.none(),
    st.lists(st.text(max_size=3), min_size=1, max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_wrong_type_in_any_numeric_field_is_reported_at_its_path(
    numeric_fields: list[tuple[dict, tuple]], data: st.DataObject
) -> None:
    doc, parts = data.draw(st.sampled_from(numeric_fields))
    bad = data.draw(_WRONG_TYPES)
    mutated = copy.deepcopy(doc)
    node = mutated
    for key in parts[:-1]:
        node = node[key]
    node[parts[-1]] = bad
    with pytest.raises(ConfigError) as info:
        validate_document(mutated, config_version(mutated))
    assert json_path(parts) in str(info.value)


def test_repeated_keys_are_an_error_naming_their_path(tmp_path: Path) -> None:
    """json.loads would keep the last of two same-named stages and silently drop the first."""
    text = (
        '{"model": {"type": "x", "context_length": 8, "decoder": {"filename": "a.onnx",'
        ' "pipeline": [{"stage": {"filename": "a.onnx"}, "stage": {"filename": "b.onnx"}}]}}}'
    )
    (tmp_path / "genai_config.json").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_document(tmp_path)
    assert [str(p) for p in err.value.problems] == [
        "model.decoder.pipeline[0].stage: key repeated in the same object"
    ]
