"""The OpenAI-compatible server, live on 127.0.0.1 (port 0), driven by the official ``openai``
client and by raw HTTP (httpx) for what the client hides (status codes, headers, bodies)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import jsonschema
import numpy as np
import pytest
from conftest import captured_logs, require_shared
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

import genai_runtime as og  # noqa: E402
from genai_runtime.cli import main as cli_main  # noqa: E402
from genai_runtime.server import ServerHandle  # noqa: E402

SMALL = "smollm2-135m-instruct-int4-2layers"
FULL = "smollm2-135m-instruct-int4"
KEY = "s3cret-key"
ALLOWED = {200, 400, 401, 404, 413, 429}


def _client(handle: ServerHandle, key: str = "unused", **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=handle.url + "/v1", api_key=key, max_retries=0, **kw)


@pytest.fixture(scope="module")
def full():
    handle = ServerHandle(str(require_shared("models", FULL)), port=0).start()
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def small():
    handle = ServerHandle(
        str(require_shared("models", SMALL)), port=0, max_active=4, max_queued=32
    ).start()
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def guarded():
    """Small limits and an API key: auth, 413, 429, context and fuzz tests."""
    handle = ServerHandle(
        str(require_shared("models", SMALL)),
        port=0,
        api_key=KEY,
        max_active=1,
        max_queued=1,
        max_body=4096,
        max_context=1024,
    ).start()
    yield handle
    handle.stop()


def _chat(client, name, text, **kw):
    return client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": text}], **kw
    )


def _stream_text(stream) -> tuple[str, list]:
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


# -- Must show 1: the openai client on the real SmolLM2 model ----------------------------------


def test_openai_client_on_smollm2(full):
    client = _client(full)
    assert [m.id for m in client.models.list().data] == [FULL]
    q = "What is the capital of France?"
    plain = _chat(client, FULL, q, temperature=0, max_tokens=24)
    assert plain.choices[0].finish_reason in ("stop", "length")
    assert plain.usage.completion_tokens <= 24
    text, chunks = _stream_text(
        _chat(client, FULL, q, temperature=0, max_tokens=24, stream=True,
              stream_options={"include_usage": True})
    )  # fmt: skip
    assert text == plain.choices[0].message.content and "Paris" in text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == plain.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == plain.usage.total_tokens

    # The greedy text is the model's own: the runtime's Generator gives the same tokens.
    model = og.Model(str(require_shared("models", FULL)))
    tok = og.Tokenizer(model)
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]))
    assert plain.usage.prompt_tokens == len(ids)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + plain.usage.completion_tokens)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    out = []
    while not gen.is_done():
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    assert tok.decode([t for t in out if t not in model.spec.tokens.eos]) == text

    prompt = "The three primary colours are"
    comp = client.completions.create(model=FULL, prompt=prompt, temperature=0, max_tokens=12)
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=FULL, prompt=prompt, temperature=0, max_tokens=12, stream=True
        )
    )
    assert streamed == comp.choices[0].text and comp.usage.completion_tokens == 12


# -- Must show 2: concurrency, first token behind a long request, cancellation ------------------


def test_concurrent_greedy_streams_equal_their_solo_runs(small):
    client = _client(small)
    prompts = ["Once upon a time", "def add(a, b):", "The sky is blue because", "1, 2, 3,"]

    def run(p):
        # Text and each token's log-probability: equal floats mean equal computations.
        text, lps = "", []
        stream = client.completions.create(
            model=SMALL, prompt=p, temperature=0, max_tokens=40, logprobs=0, stream=True
        )
        for chunk in stream:
            text += chunk.choices[0].text
            if chunk.choices[0].logprobs:
                lps += chunk.choices[0].logprobs.token_logprobs
        return text, lps

    solo = [run(p) for p in prompts]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(run, prompts))
    assert together == solo
    assert len({tuple(lps) for _, lps in solo}) == 4 and all(len(lps) == 40 for _, lps in solo)


def test_short_request_gets_its_first_token_before_a_long_one_ends(small):
    client = _client(small)
    marks = {}

    def long():
        stream = _chat(client, SMALL, "Write a long essay", temperature=0, max_tokens=120,
                       stream=True)  # fmt: skip
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                marks.setdefault("long_first", time.monotonic())
        marks["long_end"] = time.monotonic()

    thread = threading.Thread(target=long)
    thread.start()
    while "long_first" not in marks:
        time.sleep(0.01)
    stream = _chat(client, SMALL, "Hi", temperature=0, max_tokens=2, stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content is not None:
            marks.setdefault("short_first", time.monotonic())
    thread.join()
    assert marks["short_first"] < marks["long_end"]


def _idle(handle: ServerHandle, within: float = 10.0) -> dict:
    deadline = time.monotonic() + within
    while True:
        health = httpx.get(handle.url + "/health").json()
        if (health["active"] == 0 and health["queued"] == 0) or time.monotonic() > deadline:
            return health


def test_client_timeouts_cancel_requests(small):
    client = _client(small, timeout=0.3)

    def doomed(i):
        if i % 2:
            with pytest.raises(openai.APITimeoutError):
                _chat(client, SMALL, f"Write a very long story number {i}", temperature=0,
                      max_tokens=1000)  # fmt: skip
            return
        # A stream keeps sending, so its client gives up by its own 0.3 s deadline (or the
        # client's timeout fires first while the request waits in the queue).
        start = time.monotonic()
        with contextlib.suppress(openai.APITimeoutError):
            stream = _chat(client, SMALL, f"Write a long story {i}", temperature=0,
                           max_tokens=1000, stream=True)  # fmt: skip
            with stream:
                for _ in stream:
                    if time.monotonic() - start > 0.3:
                        break

    with ThreadPoolExecutor(20) as pool:
        list(pool.map(doomed, range(20)))
    health = _idle(small)
    assert health["active"] == 0 and health["queued"] == 0
    after = _chat(_client(small), SMALL, "Hello", temperature=0, max_tokens=4)
    assert after.usage.completion_tokens >= 1
    metrics = httpx.get(small.url + "/metrics").text
    assert 'genai_requests_total{outcome="cancelled"}' in metrics


def test_seed_gives_the_same_tokens_alone_and_under_concurrency(small):
    client = _client(small)

    def sampled(seed):
        return _chat(client, SMALL, "Invent a word", temperature=1.0, top_p=0.95, seed=seed,
                     max_tokens=16).choices[0].message.content  # fmt: skip

    alone = sampled(7)
    assert sampled(7) == alone
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(sampled, [7, 8, 7, 9]))
    assert results[0] == results[2] == alone


def test_prefix_reuse_and_fields(small, caplog):
    client = _client(small)
    system = {"role": "system", "content": "You are a terse assistant. " * 8}
    first = [system, {"role": "user", "content": "Hi"}]
    a = client.chat.completions.create(model=SMALL, messages=first, temperature=0, max_tokens=6)
    more = [*first, {"role": "assistant", "content": a.choices[0].message.content},
            {"role": "user", "content": "And then?"}]  # fmt: skip
    b = client.chat.completions.create(model=SMALL, messages=more, temperature=0, max_tokens=6)
    assert b.usage.prompt_tokens_details.cached_tokens > len(system["content"]) // 8

    stop = client.completions.create(
        model=SMALL, prompt="1, 2, 3, 4,", temperature=0, max_tokens=30, stop=[" 7"]
    )
    full = client.completions.create(model=SMALL, prompt="1, 2, 3, 4,", temperature=0,
                                     max_tokens=30)  # fmt: skip
    if " 7" in full.choices[0].text:
        assert stop.choices[0].text == full.choices[0].text.split(" 7")[0]
        assert stop.choices[0].finish_reason == "stop"
    lp = _chat(client, SMALL, "Hi", temperature=0, max_tokens=3, logprobs=True, top_logprobs=3)
    content = lp.choices[0].logprobs.content
    assert len(content) == lp.usage.completion_tokens
    assert all(len(c.top_logprobs) == 3 and c.logprob <= 0 for c in content)
    assert content[0].top_logprobs[0].logprob == pytest.approx(content[0].logprob)
    # unknown fields are ignored (their names logged), top_k is honoured (top_k=1 is greedy);
    # the prompt itself is never logged
    caplog.set_level(logging.DEBUG, logger="genai_runtime.server")
    _chat(client, SMALL, "zebra-unicorn-secret", max_tokens=2, extra_body={"frobnicate": 3})
    assert "frobnicate" in caplog.text and "zebra-unicorn" not in caplog.text
    g = _chat(client, SMALL, "Hi", max_tokens=5, extra_body={"top_k": 1})
    assert (
        g.choices[0].message.content
        == _chat(client, SMALL, "Hi", temperature=0, max_tokens=5).choices[0].message.content
    )


# -- Must show 3: limits, errors, auth, sandbox, fuzz -----------------------------------------


def _post(handle, path, body, key=KEY, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(handle.url + path, content=data, headers=headers, timeout=60, **kw)


def _envelope(response) -> dict:
    err = response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def test_auth_matrix(guarded):
    body = {"model": SMALL, "prompt": "Hi", "max_tokens": 2}
    assert _post(guarded, "/v1/completions", body, key=None).status_code == 401
    wrong = _post(guarded, "/v1/completions", body, key="s3cret-kez")
    assert wrong.status_code == 401 and _envelope(wrong)["code"] == "invalid_api_key"
    assert _post(guarded, "/v1/completions", body).status_code == 200
    assert httpx.get(guarded.url + "/v1/models").status_code == 401
    assert httpx.get(guarded.url + "/health").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        _client(guarded, key="nope").models.list()
    assert _client(guarded, key=KEY).models.list().data[0].id == SMALL


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"model": SMALL, "prompt": "Hi", "n": 2, "best_of": 3}, 400, "unsupported_value"),
        ({"model": SMALL, "prompt": "Hi", "max_tokens": 1024}, 400, "context_length_exceeded"),
        ({"model": "/etc/passwd", "prompt": "Hi"}, 404, "model_not_found"),
        ({"model": "../" + SMALL, "prompt": "Hi"}, 404, "model_not_found"),
        ({"model": SMALL, "prompt": "x " * 3000}, 413, "request_too_large"),
        ({"model": SMALL, "prompt": "Hi", "temperature": "hot"}, 400, None),
        ({"model": SMALL, "prompt": "Hi", "stop": ["a", "b", "c", "d", "e"]}, 400, None),
    ],
)
def test_errors_use_the_envelope(guarded, body, status, code):
    response = _post(guarded, "/v1/completions", body)
    assert response.status_code == status
    assert _envelope(response)["code"] == code


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("stream", [False, True])
def test_response_format_json_schema_gives_json_the_schema_accepts(full, stream):
    client = _client(full)
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    messages = [{"role": "user", "content": "Describe Ada Lovelace as JSON with name and age."}]
    if stream:
        chunks = client.chat.completions.create(
            model=FULL, messages=messages, temperature=0, max_tokens=64,
            response_format=fmt, stream=True,
        )  # fmt: skip
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        reply = client.chat.completions.create(
            model=FULL, messages=messages, temperature=0, max_tokens=64, response_format=fmt
        )
        assert reply.choices[0].finish_reason == "stop"
        text = reply.choices[0].message.content
    jsonschema.validate(json.loads(text), PERSON)


def test_response_format_errors_are_400_before_any_token(guarded):
    for fmt in (
        {"type": "json_schema", "json_schema": {"name": "x"}},  # no schema
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
        {"type": "xml"},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}},  # no value
    ):
        body = {"model": SMALL, "messages": [{"role": "user", "content": "Hi"}],
                "response_format": fmt}  # fmt: skip
        response = _post(guarded, "/v1/chat/completions", body)
        assert response.status_code == 400, (fmt, response.text)
        assert _envelope(response)["param"] == "response_format"


def _wait_health(handle, key, value):
    deadline = time.monotonic() + 20
    while httpx.get(handle.url + "/health").json()[key] < value:
        assert time.monotonic() < deadline, f"{key} never reached {value}"
        time.sleep(0.01)


def test_queue_full_is_429_with_retry_after(guarded):
    long = {"model": SMALL, "prompt": "Once upon a time", "max_tokens": 900, "temperature": 0,
            "stream": True}  # fmt: skip
    with httpx.Client(timeout=60) as c:
        head = {"Authorization": f"Bearer {KEY}"}
        with c.stream("POST", guarded.url + "/v1/completions", json=long, headers=head) as r1:
            lines = r1.iter_lines()  # kept: a dropped iterator closes the response
            next(lines)
            _wait_health(guarded, "active", 1)  # running (max_active=1)
            with c.stream("POST", guarded.url + "/v1/completions", json=long, headers=head) as r2:
                _wait_health(guarded, "queued", 1)
                r3 = _post(guarded, "/v1/completions", long)
                assert r3.status_code == 429 and r3.headers["retry-after"] == "1"
                assert _envelope(r3)["type"] == "rate_limit_error"
                assert r2.status_code == 200
    assert _idle(guarded)["active"] == 0


def test_template_injection_stays_text(guarded):
    attack = "{{ ''.__class__.__mro__[1].__subclasses__() }}{% for x in range(10**9) %}{% endfor %}"
    tok = og.Tokenizer(str(require_shared("models", SMALL)))
    rendered = tok.apply_chat_template([{"role": "user", "content": attack}])
    assert attack in rendered  # message content is data, never template source
    body = {"model": SMALL, "messages": [{"role": "user", "content": attack}], "max_tokens": 1}
    response = _post(guarded, "/v1/chat/completions", body)
    assert response.status_code == 200
    assert response.json()["usage"]["prompt_tokens"] == len(tok.encode(rendered))


def test_hostile_chat_template_is_refused_by_the_sandbox(tmp_path):
    src = require_shared("models", SMALL)
    for f in src.iterdir():
        if f.name != "chat_template.jinja":
            shutil.copy(f, tmp_path / f.name)
    (tmp_path / "chat_template.jinja").write_text(
        "{{ ''.__class__.__mro__[1].__subclasses__() }}{{ messages[0]['content'] }}"
    )
    handle = ServerHandle(str(tmp_path), port=0).start()
    try:
        body = {"model": tmp_path.name, "messages": [{"role": "user", "content": "Hi"}]}
        response = _post(handle, "/v1/chat/completions", body, key=None)
        assert response.status_code == 400
        assert "SecurityError" in _envelope(response)["message"]
        assert httpx.get(handle.url + "/health").status_code == 200
    finally:
        handle.stop()


CANARY = "canary-7f3a"  # in every fuzzed text: it must never reach the server's logs


def _nested(depth: int) -> dict:
    node: dict = {"type": "string"}
    for _ in range(depth):
        node = {"items": node}  # compact: 150 levels fit the guarded server's 4 KiB body limit
    return node


# Text a client may send that Python keeps but a tokenizer chokes on or reads specially: lone
# surrogates, NULs, special-token text.
_text = st.builds(
    lambda a, b: CANARY + a + b,
    st.text(max_size=12),
    st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=2)
    | st.sampled_from(["", "\x00", "a\x00b", "<|im_end|>\n<|im_start|>system\n", "<|endoftext|>"]),
)
_int = st.integers(-(2**70), 2**70) | st.sampled_from([2**31, 2**63, 2**64, -(2**63) - 1])
_value = st.recursive(
    st.none() | st.booleans() | _int | st.floats() | st.text(max_size=20) | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=8,
)  # fmt: skip
_fields = [
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "top_k", "n", "stop", "seed", "stream", "stream_options", "logprobs", "top_logprobs",
    "response_format", "echo", "suffix", "frequency_penalty", "thinking_token_budget",
    "reasoning", "input", "encoding_format", "dimensions",
]  # fmt: skip
_content = _text | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _text}),
                            max_size=2)  # fmt: skip
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant"]), "content": _content}
)
_format = st.sampled_from([
    {"type": "json_object"},
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}},
    {"type": "json_schema", "json_schema": {"name": "x", "schema": _nested(150)}},
    {"type": "json_schema", "json_schema": {"name": "x", "schema": _nested(40)}},
])  # fmt: skip
PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/nope"]
_good = {
    "model": st.just(SMALL),
    "messages": st.lists(_message, min_size=1, max_size=3),
    "prompt": _text | st.lists(_int | st.integers(0, 50000), min_size=1, max_size=4),
    "max_tokens": st.integers(1, 4),
}
_body = st.one_of(
    st.dictionaries(st.sampled_from(_fields), _value, max_size=6),
    st.fixed_dictionaries(
        _good,
        optional={
            "response_format": _format | _value,
            **{f: _value for f in _fields if f not in _good and f != "response_format"},
        },
    ),
    st.binary(max_size=64),
)


@settings(
    max_examples=int(os.environ.get("GENAI_RUNTIME_FUZZ_EXAMPLES", "40")),  # CI: a few seconds
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    body=_body,
    path=st.sampled_from(PATHS),
    key=st.sampled_from([KEY, KEY, KEY, None, "bad"]),
)
def test_fuzzed_request_bodies_never_500(guarded, body, path, key):
    with captured_logs("genai_runtime", "uvicorn", "uvicorn.error") as logs:
        response = _post(guarded, path, body, key=key)
        assert response.status_code in ALLOWED, response.text
        if response.status_code != 200:
            _envelope(response)
        elif not response.headers["content-type"].startswith("text/event-stream"):
            assert response.json()["choices"]
    assert CANARY not in logs[0]


def test_serve_refuses_a_public_host_without_a_key(capsys):
    path = str(require_shared("models", SMALL))
    assert cli_main(["serve", path, "--host", "0.0.0.0", "--port", "0"]) == 1
    assert "--insecure" in capsys.readouterr().err


def test_health_is_503_when_the_model_failed_to_load(tmp_path):
    (tmp_path / "genai_config.json").write_text("{}")
    handle = ServerHandle(str(tmp_path), port=0).start(wait_for_model=False)
    try:
        handle.loaded.wait(30)
        health = httpx.get(handle.url + "/health")
        assert health.status_code == 503 and health.json()["status"] == "error"
        r = _post(handle, "/v1/completions", {"model": tmp_path.name, "prompt": "Hi"}, key=None)
        message = _envelope(r)["message"]
        assert r.status_code == 503 and "could not be loaded" in message
        assert "genai_config.json" in message and str(tmp_path) not in message  # no server paths
    finally:
        handle.stop()


def test_batched_rows_equal_their_solo_runs(small):
    """The engine's batched backend: each of 4 rows decoded together matches that row alone."""
    from genai_runtime.batching.slots import BatchedSlots

    model = small.state.engine.model
    tok = small.state.engine.tokenizer
    prompts = [np.asarray(tok.encode(p), np.int64) for p in ("a b c", "Hello", "1 2 3 4 5", "x")]

    def run(which):
        slots = BatchedSlots(model, 4, 256)
        out = {i: [int(np.argmax(slots.prefill(i, prompts[i], 0)))] for i in which}
        for _ in range(20):
            logits = slots.decode(which, np.array([out[i][-1] for i in which]))
            for j, i in enumerate(which):
                out[i].append(int(np.argmax(logits[j])))
        return out

    together = run([0, 1, 2, 3])
    for i in range(4):
        assert run([i])[i] == together[i]


def test_models_folder_name_is_not_a_path(small):
    r = httpx.get(small.url + "/v1/models/" + str(Path("/etc") / "passwd"))
    assert r.status_code == 404 and _envelope(r)["code"] == "model_not_found"
    assert httpx.get(small.url + "/v1/nothing").status_code == 404


def test_per_request_timeout():
    handle = ServerHandle(str(require_shared("models", SMALL)), port=0, timeout=0.5).start()
    try:
        body = {"model": SMALL, "prompt": "Once", "max_tokens": 2000, "temperature": 0}
        start = time.monotonic()
        r = _post(handle, "/v1/completions", body, key=None)
        assert r.status_code == 408 and _envelope(r)["code"] == "timeout"
        assert time.monotonic() - start < 10
        with httpx.stream("POST", handle.url + "/v1/completions", json={**body, "stream": True},
                          timeout=30) as r:  # fmt: skip
            frames = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert json.loads(frames[-2][6:])["error"]["code"] == "timeout"
        assert frames[-1] == "data: [DONE]"
        assert _idle(handle)["active"] == 0
    finally:
        handle.stop()


def test_serve_command_on_port_0():
    path = str(require_shared("models", SMALL))
    proc = subprocess.Popen(
        [sys.executable, "-m", "genai_runtime", "serve", path, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"serving '{SMALL}' on http://127.0.0.1:")
        url = line.split(" on ")[1].split()[0]  # then "(context N tokens: ...)"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url.removesuffix("/v1") + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.1)
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
        assert client.completions.create(model=SMALL, prompt="Hi", max_tokens=2).usage
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize(
    "extra",
    [{"top_k": 2**40, "temperature": 1.0}, {"temperature": 1e-300}, {"top_p": 0.0, "seed": -5}],
)
def test_extreme_sampling_values_do_not_stop_the_engine(guarded, extra):
    body = {"model": SMALL, "prompt": "Hi", "max_tokens": 2, **extra}
    assert _post(guarded, "/v1/completions", body).status_code in (200, 400)
    after = _post(guarded, "/v1/completions", {"model": SMALL, "prompt": "Hi", "max_tokens": 1})
    assert after.status_code == 200
