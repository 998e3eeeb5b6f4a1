"""onnxruntime's telemetry stays off: after ``run``, nothing appears under the cache folder
onnxruntime writes its device id and event queue to, unless ``GENAI_RUNTIME_TELEMETRY=1``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# onnxruntime collects nothing when it sees a CI run; these runs must look like a user's.
_CI_VARS = ("CI", "GITHUB_ACTIONS", "TF_BUILD", "BUILD_BUILDID", "ORT_DISABLE_TELEMETRY")


def _files_after_run(model_dir: Path, home: Path, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k not in _CI_VARS}
    clean |= {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), **env}
    argv = [sys.executable, "-m", "genai_runtime", "run", str(model_dir), "hi"]
    done = subprocess.run(
        [*argv, "--max-new-tokens", "2", "--greedy"],
        env=clean, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return sorted(
        str(p.relative_to(home)) for p in home.rglob("*") if p.is_file() and "Microsoft" in p.parts
    )


def test_run_leaves_no_telemetry_files(smollm2_2layers_dir, tmp_path):
    assert _files_after_run(smollm2_2layers_dir, tmp_path / "off") == []
    opted_in = _files_after_run(smollm2_2layers_dir, tmp_path / "on", GENAI_RUNTIME_TELEMETRY="1")
    if not opted_in:
        pytest.skip("this onnxruntime writes no telemetry files even when allowed")
    assert any(name.endswith("deviceid") for name in opted_in), opted_in
