"""``/v1/audio/transcriptions`` on a live server, driven by the official ``openai`` client."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import require_shared

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("multipart")
sf = pytest.importorskip("soundfile")

from genai_runtime.server import ServerHandle  # noqa: E402


@pytest.fixture(scope="module")
def server():
    handle = ServerHandle(str(require_shared("models", "whisper-tiny.en-int4")), port=0).start()
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def client(server: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def short_clip(tmp_path_factory) -> Path:
    """The first 3.6 s of jfk.flac ("And so, my fellow Americans"), as 16-bit WAV."""
    pcm, rate = sf.read(require_shared("fixtures", "audio", "jfk.flac"), dtype="float32")
    path = tmp_path_factory.mktemp("audio") / "fellow.wav"
    sf.write(path, pcm[: int(3.6 * rate)], rate, subtype="PCM_16")
    return path


def test_the_openai_client_gets_a_transcript(client, server, short_clip: Path) -> None:
    name = server.state.served_name
    with short_clip.open("rb") as f:
        result = client.audio.transcriptions.create(model=name, file=f)
    assert "fellow Americans" in result.text and not result.text.startswith(" ")
    with short_clip.open("rb") as f:
        text = client.audio.transcriptions.create(model=name, file=f, response_format="text")
    assert text == result.text
    with short_clip.open("rb") as f:
        verbose = client.audio.transcriptions.create(
            model=name, file=f, response_format="verbose_json",
            timestamp_granularities=["segment"],
        )  # fmt: skip
    assert verbose.duration == pytest.approx(3.6, abs=0.01)
    assert verbose.segments and "fellow" in verbose.text
    for seg in verbose.segments:
        assert 0.0 <= seg.start < seg.end <= 3.6 and seg.text.strip()


def test_bad_requests_are_clear_4xx(client, server, short_clip: Path) -> None:
    name = server.state.served_name
    with pytest.raises(openai.BadRequestError, match="not a readable audio file") as bad:
        client.audio.transcriptions.create(model=name, file=("notes.wav", b"plain text, no audio"))
    assert bad.value.body["param"] == "file" and "tmp" not in bad.value.body["message"]
    one = np.full(1, 0.1, np.float32)
    tiny = short_clip.with_name("one.wav")
    sf.write(tiny, one, 16000)
    with pytest.raises(openai.BadRequestError, match="too short"):
        client.audio.transcriptions.create(model=name, file=tiny.open("rb"))
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.audio.transcriptions.create(model="whisper-1", file=short_clip.open("rb"))
    for field, value in (("temperature", 0.7), ("language", "fr"), ("prompt", "Hello")):
        with pytest.raises(openai.BadRequestError) as refused:
            client.audio.transcriptions.create(model=name, file=short_clip.open("rb"),
                                               **{field: value})  # fmt: skip
        assert refused.value.body["param"] == field
    url = server.url + "/v1/audio/transcriptions"
    assert httpx.post(url, json={"model": name}).status_code == 400  # not multipart
    limit = server.state.max_audio_bytes
    server.state.max_audio_bytes = 4096
    try:
        too_big = httpx.post(url, data={"model": name}, files={"file": short_clip.read_bytes()})
        assert too_big.status_code == 413
        assert json.loads(too_big.text)["error"]["code"] == "request_too_large"
    finally:
        server.state.max_audio_bytes = limit


def test_a_text_model_refuses_audio(short_clip: Path) -> None:
    handle = ServerHandle(
        str(require_shared("models", "smollm2-135m-instruct-int4-2layers")), port=0
    ).start()
    try:
        client = openai.OpenAI(base_url=handle.url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="does not take audio"):
            client.audio.transcriptions.create(
                model=handle.state.served_name, file=short_clip.open("rb")
            )
    finally:
        handle.stop()
