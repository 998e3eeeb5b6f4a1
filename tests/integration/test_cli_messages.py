"""The command line speaks in flags and slash commands: none of its messages names a Python call
(``reset()``, ``set_guidance``, ``apply_chat_template(..., template_str=...)``)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys

import pytest

from genai_runtime.cli import main

PYTHON_WORDS = re.compile(r"\b\w+\((\)|\.\.\.)|set_guidance|apply_chat_template|template_str")


@pytest.fixture(scope="module")
def base_model(tmp_path_factory, smollm2_2layers_dir):
    """The 2-layer SmolLM2 without a chat template: a base model's folder."""
    folder = tmp_path_factory.mktemp("base") / "m"
    shutil.copytree(smollm2_2layers_dir, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def _err(capsys, *argv) -> str:
    assert main([str(a) for a in argv]) != 0
    return capsys.readouterr().err


def test_cli_errors_name_flags_not_calls(capsys, tmp_path, smollm2_2layers_dir, base_model):
    bad_schema = tmp_path / "schema.json"
    bad_schema.write_text('{"type": 5}')
    errors = {
        "chat on a base model": _err(capsys, "chat", base_model),
        "run --chat on a base model": _err(capsys, "run", base_model, "hi", "--chat"),
        "--regex": _err(capsys, "run", smollm2_2layers_dir, "hi", "--regex", "("),
        "--json-schema": _err(
            capsys, "run", smollm2_2layers_dir, "hi", "--json-schema", bad_schema
        ),
        "--max-length": _err(capsys, "run", smollm2_2layers_dir, "hi", "--max-length", "3"),
        "a typo": _err(capsys, "run", smollm2_2layers_dir, "hi", "--temprature", "1"),
        "a command typo": _err(capsys, "rnu", smollm2_2layers_dir),
    }
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        errors["a port in use"] = _err(capsys, "serve", smollm2_2layers_dir, "--port", port)
    assert "--chat" in errors["run --chat on a base model"]
    assert "genai-runtime run" in errors["chat on a base model"]
    assert "--regex" in errors["--regex"] and "--json-schema" in errors["--json-schema"]
    assert "--max-new-tokens" in errors["--max-length"]
    assert "did you mean '--temperature'" in errors["a typo"]
    assert "did you mean 'run'" in errors["a command typo"]
    assert f":{port}" in errors["a port in use"] and "--port" in errors["a port in use"]
    for what, text in errors.items():
        assert text.strip() and not PYTHON_WORDS.search(text), (what, text)


def test_chat_messages_speak_cli(smollm2_2layers_dir):
    stdin = "/system\n" + ("word " * 80) + "\nHi\n"
    done = subprocess.run(
        [sys.executable, "-m", "genai_runtime", "chat", str(smollm2_2layers_dir),
         "--max-new-tokens", "4", "--max-length", "64"],
        input=stdin, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "(system message: none; /system TEXT sets one)" in done.stdout
    assert "/reset starts over" in done.stderr and re.search(r"\(\d+ tokens", done.stderr)
    assert not PYTHON_WORDS.search(done.stdout + done.stderr), done.stdout + done.stderr
