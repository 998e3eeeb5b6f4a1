"""A pulled model's name works wherever a folder does, and ``serve`` logs one access line per
request (never prompt text).

The cache (``$GENAI_RUNTIME_CACHE``) holds the 2-layer SmolLM2 under the name ``smollm2``, the
name ``pull`` gives it: that is all a pulled model is to everything that opens one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

import genai_runtime as og
from genai_runtime.cli import main
from genai_runtime.errors import ConfigError

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

NAME = "smollm2"
SECRET = "zebra-umbrella-42"  # prompt text that must never reach the log


@pytest.fixture(scope="module")
def cache(smollm2_2layers_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("pulled")
    shutil.copytree(smollm2_2layers_dir, root / NAME, copy_function=shutil.copyfile)
    return root


@pytest.fixture
def pulled(cache, monkeypatch, tmp_path):
    monkeypatch.setenv("GENAI_RUNTIME_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)  # no folder called smollm2 here: the name is what resolves
    return cache


def test_library_and_cli_open_a_pulled_name(pulled, capsys):
    model = og.Model(NAME)
    assert model.model_dir == pulled / NAME
    assert og.Config(NAME).spec.model_dir == pulled / NAME
    assert og.Tokenizer(model).encode("hi").tolist()
    assert main(["validate", NAME]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {pulled / NAME} (v1, route decoder)")
    assert main(["explain", NAME, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["route"]["kind"] == "decoder"


def test_names_that_resolve_to_nothing_say_so(pulled, capsys, monkeypatch):
    with pytest.raises(ConfigError, match=r"nosuch is neither a model folder.*pull --list"):
        og.Model("nosuch")
    monkeypatch.setenv("GENAI_RUNTIME_CACHE", str(pulled / "empty"))
    assert main(["validate", NAME]) == 1  # a known name, not pulled: the CLI says how to get it
    assert "run: genai-runtime pull smollm2" in capsys.readouterr().err


def test_serve_a_pulled_name_with_an_access_log(pulled):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(
        [sys.executable, "-m", "genai_runtime", "serve", NAME, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        url = re.search(r"serving 'smollm2' on (http://\S+)/v1", server.stdout.readline())[1]
        with httpx.Client(base_url=url, timeout=60) as client:
            deadline = time.monotonic() + 60
            while client.get("/health").status_code != 200:
                assert time.monotonic() < deadline, "the model did not load"
                time.sleep(0.1)
            ask = {"model": NAME, "max_tokens": 3, "temperature": 0}
            chat = {**ask, "messages": [{"role": "user", "content": SECRET}], "x_unknown": 1}
            assert client.post("/v1/chat/completions", json=chat).status_code == 200
            streamed = {**ask, "prompt": SECRET, "stream": True}
            with client.stream("POST", "/v1/completions", json=streamed) as reply:
                assert reply.status_code == 200 and "[DONE]" in reply.read().decode()
            assert client.get("/v1/models").status_code == 200
            assert client.get("/v1/models/other").status_code == 404
    finally:
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=30)
    access = [line for line in err.splitlines() if " genai_runtime.server.access: " in line]
    first_ok = next(i for i, line in enumerate(access) if "GET /health 200" in line)
    requests = [line.split(" genai_runtime.server.access: ")[1] for line in access[first_ok + 1 :]]
    assert len(requests) == 4, err  # one line per request
    want = [
        r"POST /v1/chat/completions 200 tokens \d+\+3 \d+ ms ignored: x_unknown",
        r"POST /v1/completions 200 tokens \d+\+3 \d+ ms",
        r"GET /v1/models 200 \d+ ms",
        r"GET /v1/models/other 404 \d+ ms",
    ]
    # A streamed reply's line is written when its body ends, which can be after the client has
    # read [DONE] and sent its next request: match lines to requests in any order.
    for pattern in want:
        assert sum(bool(re.fullmatch(pattern, line)) for line in requests) == 1, (pattern, requests)
    assert SECRET not in err and SECRET not in out
