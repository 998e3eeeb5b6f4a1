"""genai_runtime's 0.18 Engine API on the 2-layer SmolLM2: the state rules and errors, event
buffers, and what it does beyond the reference's CPU engine (stop strings, per-turn seeds,
minimum lengths, continuing inside a batch of several, eviction). Event-for-event parity with
the reference is ``tests/conformance/test_engine_api.py``."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from conftest import require_shared

import genai_runtime as og
from genai_runtime.errors import GenaiRuntimeError

PROMPT = np.array([1, 9690, 314, 260, 3575, 282, 4649, 47], np.int32)  # raw ids, no template


@pytest.fixture(scope="module")
def model():
    return og.Model(str(require_shared("models", "smollm2-135m-instruct-int4-2layers")))


def request(engine, session: int = 0):
    options = og.RequestOptions()
    options.set_max_session_tokens(session)
    return engine.create_request(options=options)


def turn(req, max_tokens: int = 0, **values):
    options = og.TurnOptions(req)
    options.set_max_generated_tokens(max_tokens)
    for name, value in values.items():
        getattr(options, f"set_{name}")(value)
    return options


def drain(engine, capacity: int = 8) -> dict:
    """Events per request: tokens, and the finishing event's (reason, index, usage)."""
    out: dict = {}
    buffer = engine.create_event_buffer(capacity)
    while engine.has_pending_requests():
        for e in engine.run(buffer):
            entry = out.setdefault(e.request, {"tokens": [], "turns": []})
            if e.flags & og.EngineEventFlags.TOKEN:
                entry["tokens"].append(e.token)
            if e.flags & og.EngineEventFlags.TURN_FINISHED:
                u = e.usage
                entry["turns"].append(
                    (
                        e.turn_id,
                        e.finish_reason,
                        e.matched_stop_string_index,
                        u.prompt_tokens,
                        u.generated_tokens,
                    )
                )
    return out


def test_request_and_turn_rules(model) -> None:
    engine = og.Engine(model)
    a = request(engine, session=len(PROMPT) + 3)
    with pytest.raises(TypeError):
        engine.create_request(og.RequestOptions())  # options are keyword-only
    with pytest.raises(RuntimeError, match="before a turn has begun"):
        a.cancel_turn(1)
    with pytest.raises(ValueError, match="one-dimensional"):
        a.begin_turn(PROMPT[None, :])
    with pytest.raises(RuntimeError, match="at least one input token"):
        a.begin_turn(np.array([], np.int32))
    with pytest.raises(ValueError, match="out of the vocabulary"):
        a.begin_turn(np.array([5, 10**6], np.int32))
    with pytest.raises(TypeError, match="integers"):
        a.begin_turn(np.array([1.5, 2.0]))
    with pytest.raises(RuntimeError, match="room for at least one generated token"):
        a.begin_turn(np.concatenate([PROMPT, PROMPT]))
    with pytest.raises(RuntimeError, match="different or destroyed Request"):
        a.begin_turn(PROMPT, og.TurnOptions(engine.create_request()))
    assert a.begin_turn(PROMPT) == 1  # nothing rejected above changed the request
    with pytest.raises(RuntimeError, match="new request or after the current turn is complete"):
        a.begin_turn(PROMPT)
    with pytest.raises(RuntimeError, match="complete"):
        a.rewind_to_start_of_turn(1)
    events = drain(engine)[a]
    assert len(events["tokens"]) == 3
    assert events["turns"] == [(1, og.FinishReason.MAX_SESSION_TOKENS, None, len(PROMPT), 3)]
    with pytest.raises(RuntimeError, match="not a turn of this request"):
        a.rewind_to_start_of_turn(2)
    a.close()
    a.close()  # idempotent
    for call in (
        lambda: a.begin_turn(PROMPT),
        lambda: a.cancel_turn(1),
        lambda: a.rewind_to_start_of_turn(1),
    ):
        with pytest.raises(RuntimeError, match="closed request"):
            call()
    with pytest.raises(GenaiRuntimeError, match=r"search\.max_length"):
        request(engine, session=10**6)


def test_event_buffers_drain_before_running_and_stay_with_their_engine(model) -> None:
    engine, other = og.Engine(model), og.Engine(model)
    a, b = request(engine), request(engine)
    a.begin_turn(PROMPT, turn(a, 2))
    b.begin_turn(PROMPT[:5], turn(b, 2))
    for bad in (-1, 1 << 64, 2.0):
        with pytest.raises(TypeError):
            engine.create_event_buffer(bad)
    with pytest.raises(TypeError):
        engine.run(3)
    one = engine.create_event_buffer(1)
    with pytest.raises(RuntimeError, match="Engine that created it"):
        other.run(one)
    assert len(engine.run(engine.create_event_buffer(0))) == 0  # capacity 0: a no-op
    assert engine.get_speculative_stats()["target_forward_passes"] == 0
    assert engine.run(one) is one and one[0].request is a and one[-1].request is a
    with pytest.raises(IndexError):
        one[1]
    passes = engine.get_speculative_stats()["target_forward_passes"]
    with pytest.raises(RuntimeError, match="event for this request is pending"):
        b.cancel_turn(1) and b.begin_turn(PROMPT)  # B's cancel event is still pending
    assert [e.request for e in engine.run(one)] == [b]  # retained: drained without a pass
    assert engine.get_speculative_stats()["target_forward_passes"] == passes
    assert one[0].finish_reason == og.FinishReason.CANCELLED
    assert one[0].flags == og.EngineEventFlags.TOKEN | og.EngineEventFlags.TURN_FINISHED
    # an event outlives the next run (it is a record, not a view into the buffer)
    kept = one[0]
    engine.run(one)
    assert kept.usage.generated_tokens == 1 and kept.request is b
    # closing a request drops its undelivered events; has_pending_requests then settles
    a.close()
    assert not engine.has_pending_requests()
    caps = engine.get_capabilities()
    assert (caps.configured_max_batch_size, caps.max_request_length) == (4, 0)
    errors = []
    thread = threading.Thread(target=lambda: errors.append(_raises(engine.get_capabilities)))
    thread.start()
    thread.join()
    assert "owner thread" in str(errors[0])


def _raises(call) -> Exception | None:
    try:
        call()
    except Exception as error:  # the test inspects it
        return error
    return None


def test_stop_strings_min_tokens_and_seeds(model) -> None:
    engine = og.Engine(model)
    plain = request(engine)
    plain.begin_turn(PROMPT, turn(plain, 8))
    tokens = drain(engine)[plain]["tokens"]
    text = og.Tokenizer(model).decode(np.array(tokens))
    stop = text[2:5]  # a few characters from the middle of the output
    stopped = request(engine)
    stopped.begin_turn(PROMPT, turn(stopped, 8, stop_strings=["never there", stop]))
    events = drain(engine)[stopped]
    n = len(events["tokens"])
    assert events["turns"] == [(1, og.FinishReason.STOP_STRING, 1, len(PROMPT), n)]
    assert events["tokens"] == tokens[:n] and n < 8  # the completing token is delivered

    def sampled(seed: int) -> list[int]:
        req = request(engine)
        req.begin_turn(PROMPT, turn(req, 10, do_sample=True, temperature=1.5, top_k=50, seed=seed))
        return drain(engine)[req]["tokens"]

    assert sampled(0) == sampled(0)
    assert len({tuple(sampled(seed)) for seed in (1, 2, 3)}) > 1


def test_min_generated_tokens_holds_end_of_sequence_back(model) -> None:
    config = og.Config(str(require_shared("models", "smollm2-135m-instruct-int4-2layers")))
    config.overlay('{"model": {"eos_token_id": 216}}')  # the 2-layer model's favourite token
    engine = og.Engine(og.Model(config))
    ended = []
    for floor in (0, 4):
        req = request(engine)
        req.begin_turn(PROMPT, turn(req, 10, min_generated_tokens=floor))
        ended += drain(engine)[req]["turns"]
    (_, reason, _, _, free), (_, held_reason, _, _, held) = ended
    assert reason == held_reason == og.FinishReason.EOS
    assert free == 1 and held >= 4


def test_continuing_in_a_batch_of_two_and_after_eviction(model) -> None:
    engine = og.Engine(model)
    a, b = request(engine), request(engine)
    a.begin_turn(PROMPT, turn(a, 3))
    b.begin_turn(PROMPT[:6], turn(b, 3))
    first = drain(engine)
    # both are resident in one batch: the reference refuses this, genai_runtime continues
    assert a.begin_turn(np.array([28, 339], np.int32), turn(a, 3)) == 2
    assert b.begin_turn(np.array([28, 339], np.int32), turn(b, 3)) == 2
    second = drain(engine)
    assert [len(second[r]["tokens"]) for r in (a, b)] == [3, 3]
    # four more requests take every slot; A's cache is evicted, its tokens are not
    others = [request(engine) for _ in range(4)]
    for req in others:
        req.begin_turn(PROMPT[:4], turn(req, 1))
    drain(engine)
    a.begin_turn(np.array([13], np.int32), turn(a, 4))
    resumed = drain(engine)[a]["tokens"]
    # the same history run from scratch gives the same tokens (both prefill it whole)
    history = np.concatenate([PROMPT, first[a]["tokens"], [28, 339], second[a]["tokens"], [13]])
    fresh = request(engine)
    fresh.begin_turn(history.astype(np.int32), turn(fresh, 4))
    assert drain(engine)[fresh]["tokens"] == resumed


def test_a_dropped_request_is_closed_at_the_next_call(model) -> None:
    engine = og.Engine(model)
    req = request(engine)
    req.begin_turn(PROMPT, turn(req, 50))
    engine.run(engine.create_event_buffer(8))
    del req
    gc.collect()
    assert not engine.has_pending_requests()
