"""A real Ray cluster, only ever inside a network namespace with loopback alone (Ray listens on
the node's address by default, which a shared machine must never do). Skipped, with the reason,
where Ray is not installed or ``unshare`` is not permitted.

Opt-in (``GENAI_RUNTIME_RAY_CLUSTER=1``): Ray's start, two Serve replicas and two Ray Data
actors take 40-90 s on a 2-core machine, beyond what the suite can spend; the rest of the Ray
code (the predictor, the deployment objects, the Ray guide's snippets, the CLI's refusals) is tested
without a cluster in test_batch_predictor.py and test_ray_readme.py, and
benchmarks/ray_scaleout.py measures the same cluster at full size."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import REPO, require_shared

pytest.importorskip("ray.serve")
pytest.importorskip("ray.data")
pytest.importorskip("openai")

from genai_runtime.integrations.loopback import isolated, namespace_problem

SMALL = "smollm2-135m-instruct-int4-2layers"


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    if os.environ.get("GENAI_RUNTIME_RAY_CLUSTER") != "1":
        pytest.skip("a real Ray cluster takes 40-90 s: set GENAI_RUNTIME_RAY_CLUSTER=1 to run it")
    problem = namespace_problem()
    if problem:
        pytest.skip(f"no loopback-only network namespace for Ray: {problem}")
    model_dir = str(require_shared("models", SMALL))
    home = tmp_path_factory.mktemp("rayhome")
    script = str(REPO / "tests" / "ray_cluster_check.py")
    argv, env = isolated([sys.executable, script, model_dir], home)
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("REPORT ")]
    assert run.returncode == 0 and lines, run.stdout[-2000:] + run.stderr[-4000:]
    report = json.loads(lines[-1].removeprefix("REPORT "))
    print("ray cluster check, seconds since start:", report["seconds"])  # shown with -s / -rP
    return report


def test_serve_replicas_answer_as_the_single_process_server(report):
    assert report["serve"] == report["local"]
    assert all(text and reason in ("stop", "length") for text, reason in report["serve"])


def test_map_batches_rows_in_order_with_an_error_row(report):
    assert report["data"] == report["data_expected"]
    rows = [r[0] for r in report["data"]]
    assert rows == [0, 1, 2, 3, 4, 99, 5, 6, 7]
    failed = report["data"][5]
    assert failed[3] == "error" and "context is 64 tokens" in failed[4]
    assert all(r[4] is None and r[2] >= 1 for i, r in enumerate(report["data"]) if i != 5)


def test_serve_ray_on_a_folder_that_cannot_load_exits_with_the_replica_error(tmp_path):
    """Serve gives up on a replica whose constructor keeps failing: the command exits 1, its
    ``error:`` line carrying the replica's own error (Ray's controller logs the traceback)."""
    if os.environ.get("GENAI_RUNTIME_RAY_CLUSTER") != "1":
        pytest.skip("a real Ray instance takes 20-40 s: set GENAI_RUNTIME_RAY_CLUSTER=1 to run it")
    problem = namespace_problem()
    if problem:
        pytest.skip(f"no loopback-only network namespace for Ray: {problem}")
    folder = tmp_path / "broken"
    shutil.copytree(require_shared("models", SMALL), folder)
    (folder / "model.onnx").write_bytes(b"not an onnx file")
    cli = [sys.executable, "-m", "genai_runtime", "serve", str(folder), "--ray"]
    home = Path(tempfile.mkdtemp(prefix="gr-"))  # Ray's socket paths must stay short
    argv, env = isolated(cli, home)
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert run.returncode == 1, run.stderr[-2000:]
    assert errors and "could not start the replicas" in errors[-1], run.stderr[-2000:]
    assert "ModelError" in errors[-1] and "model.onnx" in errors[-1], run.stderr[-2000:]
