"""``serve`` says "serving" only once the model is loaded and checked: a model that cannot load
(a bad adapter, a folder changed since its import) exits non-zero with the error and no
"serving" line; a model that loads is served at its own context, said at start."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("uvicorn", reason="needs the server extra")

from genai_runtime.server import ServerHandle


def _serve_fails(*argv: str) -> str:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "genai_runtime", "serve", *argv, "--port", "0"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 1 and time.monotonic() - start < 30, proc.stderr
    assert "serving" not in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr.strip().splitlines()[-1]


def test_a_bad_adapter_exits_without_serving(smollm2_2layers_dir, tmp_path):
    missing = tmp_path / "absent.onnx_adapter"
    last = _serve_fails(str(smollm2_2layers_dir), "--adapter", f"tuned={missing}")
    assert last.startswith("error:") and "absent.onnx_adapter" in last, last


def test_a_folder_changed_since_its_import_exits_without_serving(tmp_path):
    pytest.importorskip("gguf", reason="needs the gguf extra")
    from gguf_models import write_tiny_gguf

    from genai_runtime.importer import import_gguf

    out = import_gguf(write_tiny_gguf(tmp_path / "t.gguf"), tmp_path / "m", quant="fp32").out_dir
    data = out / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one weight byte, same size
    data.write_bytes(bytes(raw))
    last = _serve_fails(str(out))
    assert "changed since it was imported" in last and "model.onnx.data" in last, last


def test_the_model_is_served_at_its_own_context(smollm2_2layers_dir, capsys):
    """No --max-context: the model's own 8192 tokens (as memory allows, said at start), so a
    prompt past the old 2048-token cap is answered."""
    handle = ServerHandle(str(smollm2_2layers_dir), port=0).start()
    try:
        engine = handle.state.engine
        assert engine.context == 8192 and engine.context_source == "the model's own"
        prompt = "word " * 3000
        name = handle.state.served_name
        body = {"model": name, "prompt": prompt, "max_tokens": 2, "temperature": 0}
        reply = httpx.post(handle.url + "/v1/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["prompt_tokens"] > 2048
        over = {**body, "prompt": "word " * 9000}
        refused = httpx.post(handle.url + "/v1/completions", json=over, timeout=120)
        assert refused.status_code == 400 and "--max-context" in refused.text
    finally:
        handle.stop()


def test_serve_says_serving_with_the_context_once_loaded(smollm2_2layers_dir: Path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "genai_runtime", "serve", str(smollm2_2layers_dir), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()  # the first line on stdout
        assert line.startswith("serving ") and "(context 8192 tokens: the model's own)" in line
        url = line.split(" on ", 1)[1].split()[0]
        assert httpx.get(url.removesuffix("/v1") + "/health").status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)
