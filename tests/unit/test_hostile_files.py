"""Hostile model-folder files end in a GenaiRuntimeError (or load): whole genai_config.json/.yaml
files (depth, size, aliases, encodings, wrong JSON types at every level), tokenizer.json,
tokenizer_config.json and chat templates. Issue 13 item 2 and issue 6 item 6."""

from __future__ import annotations

import contextlib
import copy
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from genai_runtime import Tokenizer
from genai_runtime.cli import main
from genai_runtime.config import load
from genai_runtime.config.bounded import CONFIG_LIMITS, LimitError, load_json, load_yaml
from genai_runtime.errors import ConfigError, GenaiRuntimeError, TokenizerError

V1 = {
    "model": {
        "bos_token_id": 1,
        "context_length": 64,
        "decoder": {
            "filename": "model.onnx",
            "head_size": 8,
            "hidden_size": 16,
            "inputs": {"input_ids": "input_ids", "past_key_names": "past_key_values.%d.key"},
            "outputs": {"logits": "logits", "present_key_names": "present.%d.key"},
            "num_attention_heads": 2,
            "num_hidden_layers": 2,
            "num_key_value_heads": 2,
            "session_options": {"log_id": "x", "provider_options": []},
        },
        "eos_token_id": [2, 3],
        "pad_token_id": 2,
        "type": "llama",
        "vocab_size": 100,
    },
    "search": {"max_length": 64, "do_sample": False, "top_k": 5},
}


def _tiny_tokenizer_json() -> str:
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = HfTokenizer(WordLevel({"[UNK]": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4}, "[UNK]"))
    tok.pre_tokenizer = Whitespace()
    return tok.to_str()


TOKENIZER_JSON = json.loads(_tiny_tokenizer_json())
TOKENIZER_CONFIG = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    "added_tokens_decoder": {"1": {"content": "<s>", "special": True}},
}

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated(draw, base: dict) -> Any:
    """``base`` with 1-3 subtrees (any level, the root included) replaced by random JSON."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(doc)))
        value = draw(json_values)
        if not path:
            doc = value
            continue
        node = doc
        try:
            for part in path[:-1]:
                node = node[part]
            node[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            pass  # an earlier replacement removed this path
    return doc


@st.composite
def deep(draw) -> str:
    depth = draw(st.integers(1, 3000))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    return opener * depth + "1" + closer * draw(st.integers(0, depth))


config_texts = st.one_of(
    st.builds(json.dumps, mutated(V1)),
    st.builds(json.dumps, json_values),
    deep(),
    st.text(max_size=200),
)
config_bytes = st.one_of(
    config_texts.map(lambda t: t.encode("utf-8")),
    config_texts.map(lambda t: t.encode("utf-16")),
    st.binary(max_size=200),
    st.builds(lambda t: b"\xef\xbb\xbf" + t.encode(), config_texts),
)
FUZZ = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _load_folder(files: dict[str, bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            (Path(tmp) / name).write_bytes(data)
        with contextlib.suppress(GenaiRuntimeError):
            load(tmp)
        assert main(["validate", "--config-only", tmp]) in (0, 1)


@FUZZ
@given(config_bytes)
def test_whole_json_config_files_end_in_our_errors(data: bytes) -> None:
    _load_folder({"genai_config.json": data})


@FUZZ
@given(st.one_of(mutated(V1).map(yaml.safe_dump), st.text(max_size=200)))
def test_whole_yaml_config_files_end_in_our_errors(text: str) -> None:
    _load_folder({"genai_config.yaml": text.encode("utf-8")})


def _tokenizer_folder(files: dict[str, str | bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            raw = data.encode("utf-8") if isinstance(data, str) else data
            (Path(tmp) / name).write_bytes(raw)
        try:
            tok = Tokenizer(tmp)
            tok.decode(tok.encode("a b <s>"))
            tok.apply_chat_template([{"role": "user", "content": "a"}])
        except GenaiRuntimeError:
            pass


tokenizer_texts = st.one_of(
    st.builds(json.dumps, mutated(TOKENIZER_JSON)), st.builds(json.dumps, json_values), deep()
)
tokenizer_config_texts = st.one_of(
    st.builds(json.dumps, mutated(TOKENIZER_CONFIG)),
    st.builds(json.dumps, json_values),
    deep(),
    st.binary(max_size=50),
)


@FUZZ
@given(tokenizer_texts)
def test_whole_tokenizer_json_files_end_in_our_errors(text: str) -> None:
    _tokenizer_folder(
        {"tokenizer.json": text, "tokenizer_config.json": json.dumps(TOKENIZER_CONFIG)}
    )


@FUZZ
@given(tokenizer_config_texts)
def test_whole_tokenizer_config_files_end_in_our_errors(text: str | bytes) -> None:
    _tokenizer_folder({"tokenizer.json": json.dumps(TOKENIZER_JSON), "tokenizer_config.json": text})


@FUZZ
@given(st.one_of(st.text(max_size=80), st.sampled_from(
    ["{{", "{% for %}", "{{ x.__class__ }}", "{{ raise_exception('no') }}"]
)))  # fmt: skip
def test_chat_templates_end_in_our_errors(template: str) -> None:
    files = {"tokenizer.json": json.dumps(TOKENIZER_JSON), "chat_template.jinja": template}
    _tokenizer_folder(files)
    _tokenizer_folder({**files, "chat_template.json": json.dumps({"chat_template": template})})


# -- the specific files that crashed or hung --------------------------------------------------


def billion_laughs(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    lines.append(f"model: *a{levels}")
    return "\n".join(lines) + "\n"


def test_yaml_alias_bomb_is_refused_fast(tmp_path: Path, capsys) -> None:
    (tmp_path / "genai_config.yaml").write_text(billion_laughs())
    start = time.perf_counter()
    assert main(["validate", "--config-only", str(tmp_path)]) == 1
    assert time.perf_counter() - start < 5
    assert "once YAML aliases are expanded" in capsys.readouterr().err


def test_self_referencing_yaml_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "genai_config.yaml").write_text("a: &x [1, *x]\nmodel: {}\n")
    with pytest.raises(ConfigError, match=r"alias \*x refers to itself"):
        load(tmp_path)


def test_100k_deep_json_config_is_a_config_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "genai_config.json").write_text("[" * 100_000 + "]" * 100_000)
    assert main(["validate", str(tmp_path)]) == 1
    assert "nested deeper than 64 levels" in capsys.readouterr().err


def test_oversized_config_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "genai_config.json"
    with path.open("wb") as f:
        f.truncate(CONFIG_LIMITS.max_bytes + 1)  # sparse: no real disk use
    with pytest.raises(ConfigError, match="over the limit"):
        load(tmp_path)


def test_yaml_anchors_within_limits_still_work() -> None:
    doc = load_yaml("a: &x {k: [1, 2]}\nb: *x\nc: *x\n", CONFIG_LIMITS)
    assert doc == {"a": {"k": [1, 2]}, "b": {"k": [1, 2]}, "c": {"k": [1, 2]}}
    with pytest.raises(LimitError, match="deeper than 64"):
        load_yaml("[" * 65 + "]" * 65, CONFIG_LIMITS)
    with pytest.raises(LimitError, match="deeper than 64"):
        load_json("[" * 65 + "]" * 65, CONFIG_LIMITS)
    assert load_json("[" * 64 + "]" * 64, CONFIG_LIMITS) is not None


def test_deep_tokenizer_config_is_a_tokenizer_error(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text(json.dumps(TOKENIZER_JSON))
    (tmp_path / "tokenizer_config.json").write_text('{"a":' * 50_000 + "1" + "}" * 50_000)
    with pytest.raises(TokenizerError, match="nested deeper"):
        Tokenizer(tmp_path)


def test_wrong_types_in_tokenizer_config_are_tokenizer_errors(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text(json.dumps(TOKENIZER_JSON))
    (tmp_path / "tokenizer_config.json").write_text('{"added_tokens_decoder": [1, 2]}')
    with pytest.raises(TokenizerError, match="malformed tokenizer files"):
        Tokenizer(tmp_path)
