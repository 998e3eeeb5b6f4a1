"""The Ray guide (docs/guide/ray.md) stays true: its Python snippets build the Serve application
and the batch predictor (run on one batch) without starting Ray (``ray.init`` is replaced by a
refusal, which Ray's auto-init would hit too); the snippets marked "needs a running Ray cluster"
at least compile. Also the ``serve --ray`` arguments that are refused before Ray starts, and a
replica with LoRA adapters."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import REPO, require_shared

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
pytest.importorskip("ray.data.llm")

from genai_runtime.cli import main as cli_main  # noqa: E402
from genai_runtime.errors import GenaiRuntimeError  # noqa: E402
from genai_runtime.integrations.ray import BatchPredictor, build_deployment  # noqa: E402

NEEDS_CLUSTER = "# needs a running Ray cluster"
MODEL = "smollm2-135m-instruct-int4"


GUIDE = REPO / "docs" / "guide" / "ray.md"


def _ray_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.S)


def _refuse(*args, **kwargs):
    raise AssertionError("a guide snippet started Ray outside a loopback-only namespace")


def test_readme_snippets_build_without_starting_ray(monkeypatch):
    shared = require_shared("models", MODEL).parents[1]
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(ray, "init", _refuse)  # Ray's auto-init goes through ray.init too
    blocks = _ray_blocks()
    assert len(blocks) >= 5
    scope: dict = {}
    for block in blocks:
        code = block.replace("../shared", str(shared))
        if block.startswith(NEEDS_CLUSTER):
            compile(code, str(GUIDE), "exec")
            continue
        exec(compile(code, str(GUIDE), "exec"), scope)
    assert isinstance(scope["app"], serve.Application)
    assert isinstance(scope["predictor"], BatchPredictor)
    out = scope["out"]
    assert list(out["finish_reason"]) == ["length", "length"] and list(out["num_tokens"]) == [16, 4]
    assert "Paris" in out["generated_text"][0] and list(out["error"]) == [None, None]
    assert not ray.is_initialized()


def test_build_deployment_checks_its_options(smollm2_dir):
    smollm2_dir = str(smollm2_dir)
    with pytest.raises(GenaiRuntimeError, match="max_actve"):
        build_deployment(smollm2_dir, max_actve=4)
    app = build_deployment(smollm2_dir, autoscaling_config={"min_replicas": 1, "max_replicas": 3})
    assert isinstance(app, serve.Application) and not ray.is_initialized()


def test_serve_ray_refusals_come_before_ray_starts(smollm2_dir, capsys):
    smollm2_dir = str(smollm2_dir)
    assert cli_main(["serve", smollm2_dir, "--replicas", "2"]) == 2  # a usage error
    assert "--replicas is for --ray" in capsys.readouterr().err
    assert cli_main(["serve", smollm2_dir, "--ray", "--host", "0.0.0.0"]) == 1
    assert "without an API key" in capsys.readouterr().err
    assert cli_main(["serve", smollm2_dir + "-missing", "--ray"]) == 1
    assert "model folder not found" in capsys.readouterr().err
    assert not ray.is_initialized()


def test_predictor_turns_a_missing_model_into_a_clear_error(tmp_path):
    with pytest.raises(GenaiRuntimeError, match="model folder not found"):
        BatchPredictor(str(tmp_path / "nope"))


def test_a_replica_serves_lora_adapters(tmp_path):
    """``OpenAIServer`` (built here as Serve builds each replica, without Ray) loads adapters as
    ``genai-runtime serve --adapter`` does: ``base:adapter`` picks one, its greedy tokens are
    the merged weights' (NumPy); a name with ':' is refused."""
    from starlette.testclient import TestClient

    from genai_runtime.integrations.ray import OpenAIServer
    from genai_runtime.server.app import create_app
    from tests import lora_models as lm

    folder = lm.model_folder(tmp_path / "tiny", lm.base_weights())
    lm.word_tokenizer(folder)
    lm.write_adapter(folder / "a.onnx_adapter", lm.lora_weights(1))
    with pytest.raises(GenaiRuntimeError, match="without ':'"):
        OpenAIServer(str(folder), adapters={"x:y": str(folder / "a.onnx_adapter")})
    replica = OpenAIServer(
        str(folder), served_name="tiny", adapters={"a": str(folder / "a.onnx_adapter")}
    )
    try:
        client = TestClient(create_app(replica.state))
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["tiny", "tiny:a"]
        prompt = [1, 5, 9, 3, 17]
        body = {"model": "tiny:a", "prompt": prompt, "max_tokens": 4, "temperature": 0}
        reply = client.post("/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        got = [int(t) for t in re.findall(r"w(\d+)", reply.json()["choices"][0]["text"])]
        sequence = list(prompt)
        for _ in got:
            logits = lm.reference_logits(np.array(sequence), lm.base_weights(), lm.lora_weights(1))
            sequence.append(int(logits[-1].argmax()))
        assert got and got == sequence[len(prompt) :]
    finally:
        replica.state.engine.stop()
