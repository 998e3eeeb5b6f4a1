"""Prompt-lookup speculation inside the batched server, against real models.

Exactness is checked on an fp32 folder imported from a tiny GGUF: greedy and seeded sampled
replies are identical token for token with speculation on and off, while drafts were verified
and kept (the tiny random model repeats itself, so lookups match); their logprobs agree to
fp32 rounding (attention over several new tokens sums in another order than over one). The
per-row verify graph is checked against one-token steps on the shared int4 folder (whose int8
activations round a wider pass differently: there the chosen tokens agree, the logits within a
bound).
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import captured_logs, require_shared

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("onnx")

import genai_runtime as og
from genai_runtime.batching.options import EngineError, EngineValueError
from genai_runtime.batching.slots import BatchedSlots
from genai_runtime.batching.speculation import RowDrafts, RowOffer, WidthCosts, choose_width
from genai_runtime.errors import GenaiRuntimeError
from genai_runtime.server import ServeOptions, ServerHandle

PROMPTS = [
    "one two three one two three one two three",
    "Copy: the cat sat on the mat, the cat sat on the mat",
    "a b c d e f g a b c d e f g",
    "Repeat after me: hello world hello world",
]


@pytest.fixture(scope="module")
def fp32_folder(tiny_fp32_folder: Path) -> Path:
    return tiny_fp32_folder


def _together(handle: ServerHandle, bodies: list[dict]) -> list[dict]:
    """The requests sent at once (so they decode in one batch), their replies in order."""
    replies: list[dict] = [{} for _ in bodies]

    def send(i: int) -> None:
        body = {"model": handle.state.served_name, **bodies[i]}
        replies[i] = httpx.post(handle.url + "/v1/chat/completions", json=body, timeout=300).json()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return replies


def _answers(replies: list[dict]) -> list[tuple]:
    out = []
    for reply in replies:
        choice = reply["choices"][0]
        logprobs = [(c["token"], c["logprob"]) for c in choice["logprobs"]["content"]]
        out.append((choice["message"]["content"], logprobs, choice["finish_reason"]))
    return out


def _metrics(handle: ServerHandle) -> dict[str, float]:
    text = httpx.get(handle.url + "/metrics", timeout=30).text
    pairs = (line.split() for line in text.splitlines() if line.startswith("genai_speculative"))
    return {name: float(value) for name, value in pairs}


def _bodies(**sampling) -> list[dict]:
    return [
        {"messages": [{"role": "user", "content": p}], "max_tokens": 40, "logprobs": True,
         **sampling}
        for p in PROMPTS
    ]  # fmt: skip


def _serve(folder: Path, speculate: int) -> ServerHandle:
    return ServerHandle(str(folder), port=0, max_active=4, speculate=speculate,
                        prompt_cache_mb=0, prefix_reuse=False).start()  # fmt: skip


def test_speculation_keeps_greedy_and_seeded_replies_exact(fp32_folder: Path) -> None:
    greedy = _bodies(temperature=0)
    sampled = [{**b, "temperature": 0.9, "top_p": 0.95, "seed": 7 + i}
               for i, b in enumerate(_bodies())]  # fmt: skip
    handle = _serve(fp32_folder, 0)
    try:
        plain = _answers(_together(handle, greedy)), _answers(_together(handle, sampled))
        assert _metrics(handle) == {}  # off: no speculation counters
    finally:
        handle.stop()
    with captured_logs("genai_runtime.server") as logs:
        handle = _serve(fp32_folder, 6)
    assert "speculation: prompt lookup, up to 6 drafts per row" in logs[0]
    try:
        spec_replies = _together(handle, greedy)
        spec = _answers(spec_replies), _answers(_together(handle, sampled))
        counters = _metrics(handle)
    finally:
        handle.stop()
    for ours, theirs in zip(spec[0] + spec[1], plain[0] + plain[1]):
        assert ours[0] == theirs[0]  # the text
        assert [t for t, _ in ours[1]] == [t for t, _ in theirs[1]]  # token by token
        # a pass of several tokens sums attention in another order: fp32 rounding, no more
        np.testing.assert_allclose([p for _, p in ours[1]], [p for _, p in theirs[1]], atol=1e-4)
    assert [a[2] for a in spec[0]] == [a[2] for a in plain[0]]
    details = [r["usage"]["completion_tokens_details"] for r in spec_replies]
    assert sum(d["accepted_prediction_tokens"] for d in details) > 0
    assert all(d["rejected_prediction_tokens"] >= 0 for d in details)
    assert counters["genai_speculative_passes_total"] > 0
    assert counters["genai_speculative_accepted_tokens_total"] > 0
    assert (counters["genai_speculative_accepted_tokens_total"]
            <= counters["genai_speculative_draft_tokens_total"])  # fmt: skip


def test_rows_that_reach_the_context_end_while_others_draft(fp32_folder: Path) -> None:
    """A pass is padded to its widest row for every row of the batch: rows near the end of the
    context narrow it rather than overflow; replies end at the context as without speculation."""
    context = 160
    answers = {}
    for speculate in (0, 6):
        handle = ServerHandle(str(fp32_folder), port=0, max_active=4, speculate=speculate,
                              max_context=context, prompt_cache_mb=0).start()  # fmt: skip
        try:
            sizes = [r["usage"]["prompt_tokens"] for r in _together(handle, _bodies(max_tokens=1))]
            bodies = [{**b, "temperature": 0, "max_tokens": context - n}  # each fills the context
                      for b, n in zip(_bodies(), sizes)]  # fmt: skip
            answers[speculate] = _answers(_together(handle, bodies))
        finally:
            handle.stop()
    assert [a[0] for a in answers[6]] == [a[0] for a in answers[0]]
    assert {a[2] for a in answers[6]} == {"length"}


def test_verify_pass_matches_one_token_steps_on_int4() -> None:
    """Four rows of different lengths, five tokens each in one verify pass, against five
    batched one-token steps: the same argmax at every position, the keys/values close."""
    folder = require_shared("models", "smollm2-135m-instruct-int4-2layers")
    model = og.Model(og.Config(str(folder)))
    slots = BatchedSlots(model, 4, 256, verify=True)
    assert slots.verify_obstacle is None
    rng = np.random.default_rng(0)
    for s in range(4):
        slots.prefill(s, rng.integers(100, 5000, 20 + 7 * s).astype(np.int64), 0)
    held = slots._lengths.copy()
    feeds = [rng.integers(100, 5000, 5).astype(np.int64) for _ in range(4)]
    wide = slots.verify([0, 1, 2, 3], feeds)
    assert [int(n) for n in slots._lengths] == [int(n) + 5 for n in held]
    for s in range(4):
        slots.rewind(s, int(held[s]))
    steps = [slots.decode([0, 1, 2, 3], np.array([f[j] for f in feeds])) for j in range(5)]
    for s in range(4):
        for j in range(5):
            assert int(np.argmax(wide[s][j])) == int(np.argmax(steps[j][s]))
            assert float(np.abs(wide[s][j] - steps[j][s]).max()) < 1.0


def test_width_choice_weighs_acceptance_against_cost_and_each_rows_rate() -> None:
    costs = WidthCosts()
    sure, unsure = RowDrafts(8), RowDrafts(8)
    for _ in range(6):
        sure.kept(4, 4, 3)
        unsure.kept(0, 4, 2)

    def offer(drafts, bucket, emitted=100, spent=100.0):
        return RowOffer(drafts, 8, bucket, emitted, spent)

    assert choose_width([offer(unsure, 2)] * 4, costs, 8) == 1  # drafts that never match
    assert choose_width([offer(sure, 3)] * 4, costs, 8) > 2
    # a row that drafts nothing pays for a wide pass only out of its slack (5 % of its steps)
    idle = RowOffer(None, 0, 0, 100, 100.0)
    assert choose_width([offer(sure, 3)] * 3 + [idle], costs, 8) > 1
    spent = RowOffer(None, 0, 0, 100, 105.0)  # already 5 % slower than plain steps
    assert choose_width([offer(sure, 3)] * 3 + [spent], costs, 8) == 1
    costs.timed(4, 1, 0.040)
    for width in range(2, 10):
        costs.timed(4, width, 0.040 * width)  # a pass costs as much as its tokens: never wins
    assert choose_width([offer(sure, 3)] * 4, costs, 8) == 1


def test_speculate_option_is_checked() -> None:
    with pytest.raises(GenaiRuntimeError, match="speculate must be an integer from 0 to 31"):
        ServeOptions(speculate=32)
    with pytest.raises(GenaiRuntimeError, match="speculate"):
        ServeOptions(speculate=True)


def _begun(engine: og.Engine, model: og.Model, prompts: list[str]) -> list:
    """Requests begun together on ``prompts``, greedy, 40 tokens each."""
    tokenizer = og.Tokenizer(model)
    requests = []
    for text in prompts:
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(40)
        request.begin_turn(np.asarray(tokenizer.encode(text), np.int32), options)
        requests.append(request)
    return requests


def _drain(engine: og.Engine, requests: list, between=None) -> tuple[list, list, list]:
    """Runs the engine dry: each request's tokens, its turn's usage and the engine's passes
    when it finished. ``between(tokens, usage)`` runs after every ``run`` call."""
    tokens: dict = {r: [] for r in requests}
    usage: dict = {}
    passes: dict = {}
    buffer = engine.create_event_buffer(64)
    while engine.has_pending_requests():
        for event in engine.run(buffer):
            if event.flags & og.EngineEventFlags.TOKEN:
                tokens[event.request].append(event.token)
            if event.flags & og.EngineEventFlags.TURN_FINISHED:
                usage[event.request] = event.usage
                passes[event.request] = engine.get_speculative_stats()["target_forward_passes"]
        if between is not None:
            between(tokens, usage)
    return [tokens[r] for r in requests], [usage[r] for r in requests], [
        passes[r] for r in requests]  # fmt: skip


def _engine_tokens(model: og.Model, speculate: int) -> tuple[list, list, dict]:
    """Four requests begun together: their tokens, their turns' usage and the engine's
    speculative stats."""
    engine = og.Engine(model, speculate=speculate)
    tokens, usage, _ = _drain(engine, _begun(engine, model, PROMPTS))
    return tokens, usage, engine.get_speculative_stats()


def test_engine_api_speculates_with_the_same_tokens(fp32_folder: Path) -> None:
    model = og.Model(str(fp32_folder))
    plain, plain_usage, plain_stats = _engine_tokens(model, 0)
    spec, usage, stats = _engine_tokens(model, 6)
    assert spec == plain
    assert all(u.draft_tokens == 0 for u in plain_usage) and plain_stats["rounds"] == 0
    assert sum(u.accepted_draft_tokens for u in usage) == stats["draft_tokens_accepted"] > 0
    assert sum(u.draft_tokens for u in usage) == stats["draft_tokens_proposed"]
    assert stats["target_forward_passes"] < plain_stats["target_forward_passes"]
    with pytest.raises(TypeError, match="speculate"):
        og.Engine(model, speculate=32)


def test_engine_api_verifies_the_drafts_its_caller_proposes(fp32_folder: Path) -> None:
    """set_draft_tokens: request 0's caller proposes what the plain run went on to say (as a
    perfect draft model would), request 1's proposes tokens that are always wrong; both keep
    the plain tokens, request 0 in far fewer passes."""
    model = og.Model(str(fp32_folder))
    plain, _, _ = _engine_tokens(model, 0)
    engine = og.Engine(model, speculate=6)
    requests = _begun(engine, model, PROMPTS[:2])
    vocab = model.vocab_size

    def propose(tokens: dict, usage: dict) -> None:
        for i, request in enumerate(requests):
            if request not in usage:
                ahead = plain[i][len(tokens[request]) : len(tokens[request]) + 6]
                if i == 1:
                    ahead = [(t + 1) % vocab for t in ahead]
                request.set_draft_tokens(np.asarray(ahead, np.int32))

    tokens, (exact, wrong), passes = _drain(engine, requests, propose)
    assert tokens == plain[:2]
    assert exact.draft_tokens >= 30 and exact.accepted_draft_tokens >= exact.draft_tokens - 6
    assert wrong.draft_tokens >= 30 and wrong.accepted_draft_tokens == 0
    stats = engine.get_speculative_stats()
    assert stats["draft_tokens_accepted"] == exact.accepted_draft_tokens
    # request 0 takes 7 tokens a pass (a prefill, then 40 tokens in 6 passes); request 1 one
    assert passes[0] <= 1 + 6 + 2 < 40 <= passes[1]


def test_set_draft_tokens_is_checked(fp32_folder: Path) -> None:
    model = og.Model(str(fp32_folder))
    plain = og.Engine(model).create_request()
    with pytest.raises(EngineError, match="does not support speculative draft verification"):
        plain.set_draft_tokens(np.array([1, 2], np.int32))
    engine = og.Engine(model, speculate=3)
    request = engine.create_request()
    assert engine.max_draft_tokens_per_proposal() == 3
    with pytest.raises(EngineValueError, match="at most 3 per proposal"):
        request.set_draft_tokens(np.arange(4, dtype=np.int32))
    with pytest.raises(EngineValueError, match="out of the vocabulary"):
        request.set_draft_tokens(np.array([model.vocab_size], np.int32))
    with pytest.raises(EngineValueError, match="one-dimensional"):
        request.set_draft_tokens(np.zeros((1, 2), np.int32))
    request.set_draft_tokens(np.zeros(0, np.int32))  # nothing to propose: allowed
    request.close()
    with pytest.raises(EngineError, match="closed request"):
        request.set_draft_tokens(np.array([1], np.int32))
