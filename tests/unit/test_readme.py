"""README.md and docs/ stay true: every JSON config they show loads (and routes as the preset it
extends says), and the README's test command is the one CI runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import REPO

from genai_runtime.config import load
from genai_runtime.routing import classify

README = (REPO / "README.md").read_text(encoding="utf-8")
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
JSON_BLOCKS = [
    (page.relative_to(REPO), block)
    for page in PAGES
    for block in re.findall(r"^```json\n(.*?)^```", page.read_text(encoding="utf-8"), re.S | re.M)
]


def test_config_examples_load(tmp_path: Path) -> None:
    # The configs guide carries the v2 example; a page may add more, each a whole config.
    assert any(str(page) == "docs/guide/configs.md" for page, _ in JSON_BLOCKS)
    for i, (page, block) in enumerate(JSON_BLOCKS):
        folder = tmp_path / str(i)
        folder.mkdir()
        (folder / "genai_config.json").write_text(block)
        spec = load(folder)
        doc = json.loads(block)
        assert doc["version"] == 2, page
        extends = doc.get("pipeline", {}).get("extends")
        if extends == "encoder-decoder":
            assert classify(spec).kind == "encoder-decoder", page


def test_ci_runs_the_readme_test_command() -> None:
    command = "python -m pytest -q"
    assert f'pip install -e ".[dev]" && {command}' in README
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert ci.strip().splitlines()[-1] == command
