"""``POST /v1/audio/transcriptions``: OpenAI's speech-to-text route, for speech models.

A multipart upload (``file``, ``model``, optional ``response_format``, ``language``,
``temperature``, ``timestamp_granularities[]``) is read into a spooled temporary file, never
more than ``max_audio_bytes`` and within the server's read timeout; the transcription runs on a
worker thread through ``audio.longform`` (any duration: clips over 30 s go window by window),
one at a time, and stops when the client leaves or the request times out. ``json`` and ``text``
give the reference's transcript of a clip up to 30 s; ``verbose_json``, ``srt`` and ``vtt``
decode with timestamps to give timed segments. Audio the decoder cannot read, or too short for
one feature frame, is a 400 naming ``file``. Audio and text are never logged (only sizes and
timings).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ..errors import GenaiRuntimeError
from .protocol import APIError, bad

log = logging.getLogger("genai_runtime.server")

DEFAULT_MAX_AUDIO_BYTES = 25 << 20  # OpenAI's own limit for this route
MAX_WAITING = 8  # uploads held while one transcribes; more is a 429
FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
TIMED = {"verbose_json", "srt", "vtt"}
KNOWN_FIELDS = {
    "file",
    "model",
    "response_format",
    "language",
    "temperature",
    "timestamp_granularities[]",
    "timestamp_granularities",
    "prompt",
    "stream",
}
ENGLISH = {"en", "english"}
ENGLISH_ONLY_VOCAB = 51864


def transcription_route(
    state: Any, authorize: Callable[[Request], None], engine: Callable[[], Any]
) -> Route:
    """The route, sharing the app's state, API-key check and engine lookup."""
    gate = _Gate()
    processors = _Processors()

    async def transcriptions(request: Request) -> Response:
        authorize(request)
        eng = engine()
        limit = getattr(state, "max_audio_bytes", DEFAULT_MAX_AUDIO_BYTES)
        wait = getattr(state, "read_timeout", None)
        try:  # a body that stalls is cut off, as the JSON routes do
            form = await asyncio.wait_for(_read_form(request, limit), wait)
        except asyncio.TimeoutError:
            raise APIError(408, f"the upload did not arrive within {wait:g} s",
                           type="timeout_error", code="read_timeout",
                           headers={"Connection": "close"}) from None  # fmt: skip
        try:
            upload = form.get("file")
            if upload is None or isinstance(upload, str):
                raise bad("a multipart 'file' field with the audio is required", "file")
            fields = {k: v for k, v in form.multi_items() if isinstance(v, str)}
            model = fields.get("model", "")
            if model != state.served_name:
                shown = model if len(model) <= 64 else model[:61] + "..."
                raise APIError(
                    404,
                    f"the model {shown!r} is not served here (served: {state.served_name!r})",
                    param="model",
                    code="model_not_found",
                )
            unknown = sorted(set(fields) - KNOWN_FIELDS)
            if unknown:
                log.info("ignored unknown transcription fields: %s", ", ".join(unknown[:20]))
            processor = await processors.get(eng.model)
            fmt, prompt = _options(form, fields, processor)
            rid = "tr-" + uuid.uuid4().hex[:24]
            size = upload.size if upload.size is not None else -1
            log.info("%s: %d bytes of audio, %s", rid, size, fmt)
            started = time.monotonic()
            async with gate.slot():
                transcript = await _run(request, state, processor, upload.file, prompt, fmt)
            log.info("%s: %.1f s of audio in %.2f s", rid, transcript.duration,
                     time.monotonic() - started)  # fmt: skip
            return _respond(fmt, transcript, fields.get("language"))
        finally:
            await form.close()

    return Route("/v1/audio/transcriptions", transcriptions, methods=["POST"])


class _Processors:
    """The model's multimodal processor (its tokenizer takes a second to load), made once."""

    def __init__(self) -> None:
        self._made: tuple[Any, Any] | None = None

    async def get(self, model: Any) -> Any:
        if self._made is None or self._made[0] is not model:
            if not (Path(model.model_dir) / "audio_processor_config.json").is_file():
                raise bad("this model does not take audio (no audio_processor_config.json)",
                          "model")  # fmt: skip
            self._made = (model, await asyncio.to_thread(model.create_multimodal_processor))
        return self._made[1]


class _Gate:
    """One transcription at a time; at most ``MAX_WAITING`` more wait, the rest get a 429."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._waiting = 0

    def slot(self) -> _Gate:
        if self._waiting >= MAX_WAITING:
            raise APIError(429, "too many transcriptions waiting; retry later",
                           type="rate_limit_error", code="queue_full")  # fmt: skip
        return self

    async def __aenter__(self) -> None:
        self._waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self._waiting -= 1

    async def __aexit__(self, *exc_info) -> None:
        self._lock.release()


async def _read_form(request: Request, limit: int):
    """The multipart form, its body cut off (413) past ``limit`` bytes."""
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise bad("expected a multipart/form-data upload with the audio in 'file'", "file")
    length = request.headers.get("content-length", "")
    too_big = APIError(
        413, f"the upload is larger than {limit} bytes", param="file", code="request_too_large"
    )
    if length.isdigit() and int(length) > limit:
        raise too_big
    seen = 0

    async def receive():
        nonlocal seen
        message = await request.receive()
        seen += len(message.get("body", b""))
        if seen > limit:
            raise too_big
        return message

    try:
        return await Request(request.scope, receive).form(max_files=1, max_fields=32)
    except APIError:
        raise
    except Exception as exc:  # the multipart parser's own errors: a malformed body
        raise bad(f"the multipart body could not be parsed: {str(exc)[:100]}", "file") from exc


def _options(form: Any, fields: dict[str, str], processor: Any) -> tuple[str, str | None]:
    """(response_format, decoder prompt or None for the default); 400 for what is refused."""
    fmt = fields.get("response_format", "json")
    if fmt not in FORMATS:
        raise bad(f"response_format must be one of {', '.join(FORMATS)}", "response_format")
    if fields.get("stream", "false").lower() not in ("false", "0", ""):
        raise bad("streamed transcriptions are not supported", "stream")
    if fields.get("prompt"):
        raise bad("a text prompt is not supported for transcriptions", "prompt")
    try:
        temperature = float(fields.get("temperature", "0") or 0)
    except ValueError:
        raise bad("temperature must be a number", "temperature") from None
    if temperature != 0:
        raise bad("only temperature 0 (greedy decoding) is supported", "temperature")
    grains = form.getlist("timestamp_granularities[]") + form.getlist("timestamp_granularities")
    if "word" in grains:
        raise bad("word timestamps are not supported; use 'segment'", "timestamp_granularities")
    if grains and fmt != "verbose_json":
        raise bad("timestamp_granularities need response_format verbose_json",
                  "timestamp_granularities")  # fmt: skip
    language = fields.get("language", "").strip().lower()
    if not language:
        return fmt, None
    # English-only Whisper checkpoints have 51864 tokens, multilingual ones more (the rule
    # OpenAI's whisper package uses); both carry the language tokens in their vocabulary.
    multilingual = (processor.model.plan.vocab_size or 0) > ENGLISH_ONLY_VOCAB
    if not multilingual:
        if language in ENGLISH:
            return fmt, None
        raise bad(f"this model transcribes English only, not {language[:20]!r}", "language")
    code = "en" if language in ENGLISH else language
    token = f"<|{code}|>"
    if processor.tokenizer.to_token_id(token) < 0:
        raise bad(f"language {language[:20]!r} is not one this model transcribes", "language")
    return fmt, f"<|startoftranscript|>{token}<|transcribe|><|notimestamps|>"


async def _run(request: Request, state: Any, processor: Any, file: Any, prompt, fmt: str):
    """Transcribe on a worker thread; stop it when the client leaves or time runs out."""
    from ..audio.longform import transcribe_clips
    from ..multimodal.processor import TRANSCRIBE_PROMPT

    prompt = TRANSCRIBE_PROMPT if prompt is None else prompt
    stop = threading.Event()
    deadline = time.monotonic() + state.timeout
    file.seek(0)

    def stopped() -> bool:
        return stop.is_set() or time.monotonic() > deadline

    def work():
        clips = [("the uploaded file", file)]
        timed = fmt in TIMED
        model = processor.model
        return transcribe_clips(
            processor, model.new_generator, clips, prompt, timestamps=timed, stop=stopped
        )[0]

    watcher = asyncio.create_task(_watch(request, stop))
    try:
        return await asyncio.to_thread(work)
    except GenaiRuntimeError as exc:
        if time.monotonic() > deadline:
            raise APIError(408, f"the transcription took longer than {state.timeout:g} s",
                           type="timeout_error", code="timeout") from exc  # fmt: skip
        if stop.is_set():
            raise APIError(499, "the client closed the connection") from exc
        raise bad(f"the audio could not be transcribed: {exc}", "file") from exc
    finally:
        watcher.cancel()


async def _watch(request: Request, stop: threading.Event) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            stop.set()
            return


def _respond(fmt: str, transcript: Any, language: str | None) -> Response:
    text = transcript.text.strip()
    usage = {"type": "duration", "seconds": math.ceil(transcript.duration)}
    if fmt == "json":
        return JSONResponse({"text": text, "usage": usage})
    if fmt == "text":
        return PlainTextResponse(text)
    segments = [
        {
            "id": i,
            "seek": s.seek,
            "start": s.start,
            "end": s.end,
            "text": s.text,
            "tokens": list(s.tokens),
            "temperature": 0.0,
            "avg_logprob": s.avg_logprob,
            "compression_ratio": s.compression_ratio,
            "no_speech_prob": s.no_speech_prob,
        }
        for i, s in enumerate(transcript.segments)
    ]
    if fmt == "verbose_json":
        return JSONResponse(
            {
                "task": "transcribe",
                "language": (language or "english").lower(),
                "duration": transcript.duration,
                "text": text,
                "segments": segments,
                "usage": usage,
            }
        )
    lines = ["WEBVTT", ""] if fmt == "vtt" else []
    for i, s in enumerate(transcript.segments, 1):
        if fmt == "srt":
            lines.append(str(i))
        lines += [f"{_clock(s.start, fmt)} --> {_clock(s.end, fmt)}", s.text.strip(), ""]
    return PlainTextResponse("\n".join(lines), media_type="text/plain")


def _clock(seconds: float, fmt: str) -> str:
    ms = round(seconds * 1000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{',' if fmt == 'srt' else '.'}{ms:03d}"
