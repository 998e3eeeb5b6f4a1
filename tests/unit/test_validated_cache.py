"""Configs that passed JSON-Schema validation are remembered by content: loading one again skips
jsonschema (import and all), and anything else is validated in full."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from genai_runtime.config.loader import load_document
from genai_runtime.errors import ConfigError

CONFIG = {
    "model": {
        "type": "tiny",
        "vocab_size": 32,
        "context_length": 64,
        "decoder": {
            "filename": "model.onnx",
            "head_size": 8,
            "hidden_size": 16,
            "num_attention_heads": 2,
            "num_hidden_layers": 1,
            "num_key_value_heads": 2,
        },
    },
    "search": {"max_length": 16},
}

PROBE = """
import json, sys
from genai_runtime.config.loader import load_document
try:
    load_document(sys.argv[1])
    outcome = "ok"
except Exception as exc:
    outcome = type(exc).__name__
print(json.dumps([outcome, "jsonschema" in sys.modules]))
"""


def _load(path, cache_dir) -> tuple[str, bool]:
    env = {**os.environ, "GENAI_RUNTIME_VALIDATION_CACHE": str(cache_dir)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    outcome, imported = json.loads(out.stdout)
    return outcome, imported


def test_a_valid_config_is_validated_once_then_loads_without_jsonschema(tmp_path) -> None:
    config = tmp_path / "genai_config.json"
    config.write_text(json.dumps(CONFIG))
    cache = tmp_path / "validated"
    assert _load(config, cache) == ("ok", True)  # first load: full validation
    assert len(list(cache.iterdir())) == 1
    assert _load(config, cache) == ("ok", False)  # known: jsonschema never imported
    assert _load(config, "off") == ("ok", True)  # the cache can be turned off


def test_an_invalid_config_is_never_remembered(tmp_path) -> None:
    bad = json.loads(json.dumps(CONFIG))
    bad["search"]["max_length"] = "long"
    config = tmp_path / "genai_config.json"
    config.write_text(json.dumps(bad))
    cache = tmp_path / "validated"
    for _ in range(2):
        assert _load(config, cache) == ("ConfigError", True)
    assert not cache.exists() or not list(cache.iterdir())


def test_a_changed_config_is_validated_again(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GENAI_RUNTIME_VALIDATION_CACHE", str(tmp_path / "validated"))
    config = tmp_path / "genai_config.json"
    config.write_text(json.dumps(CONFIG))
    load_document(config)
    changed = json.loads(json.dumps(CONFIG))
    changed["search"]["max_length"] = -3  # valid before, one value changed: a new key
    config.write_text(json.dumps(changed))
    with pytest.raises(ConfigError, match=r"search\.max_length"):
        load_document(config)
