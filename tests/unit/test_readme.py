"""README.md stays true: its config example loads, and its test command is the one CI runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import REPO

from genai_runtime.config import load
from genai_runtime.routing import classify

README = (REPO / "README.md").read_text(encoding="utf-8")


def test_readme_config_examples_load(tmp_path: Path) -> None:
    blocks = re.findall(r"```json\n(.*?)```", README, flags=re.S)
    assert blocks
    for i, block in enumerate(blocks):
        folder = tmp_path / str(i)
        folder.mkdir()
        (folder / "genai_config.json").write_text(block)
        spec = load(folder)
        assert json.loads(block)["version"] == 2
        assert classify(spec).kind == "encoder-decoder"


def test_ci_runs_the_readme_test_command() -> None:
    command = "python -m pytest -q"
    assert f'pip install -e ".[dev]" && {command}' in README
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert ci.strip().splitlines()[-1] == command
