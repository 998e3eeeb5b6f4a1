"""onnxruntime-genai 0.18's Engine API, side by side: one conversation script runs on the
reference and on genai_runtime (the 2-layer SmolLM2, greedy) and every ``run()`` call must hand
out the same events: requests, turn ids, flags, tokens, finish reasons, stop-string indexes,
usage. The script covers a request begun while another decodes, a continued turn, a cancelled
turn (queued and active), a cancel merged into an undelivered token event, capacity-1 draining,
the session limit, guidance ending at end-of-sequence and a rewind.
"""

from __future__ import annotations

import importlib
import json
import os

import numpy as np
import pytest
from conftest import require_shared

import genai_runtime

ENGINE_NAMES = (
    *("Engine", "EngineCapabilities", "EngineErrorCode", "EngineEvent", "EngineEventBuffer"),
    *("EngineEventFlags", "FinishReason", "Request", "RequestOptions", "TurnOptions", "TurnUsage"),
)


def _reference():
    if os.environ.get("CI", "").lower() == "true":
        return importlib.import_module("onnxruntime_genai")
    return pytest.importorskip("onnxruntime_genai")


def _record(names: dict, e) -> tuple:
    u = e.usage
    return (
        names[id(e.request)], e.turn_id, int(e.flags), e.token, e.finish_reason.name,
        e.matched_stop_string_index, e.error_code.name, u.prompt_tokens, u.generated_tokens,
        u.cached_prompt_tokens,
    )  # fmt: skip


def conversation(og, model_dir: str) -> list:
    """The script: only names of onnxruntime-genai 0.18's API, so it runs on either module."""
    model = og.Model(model_dir)
    tokenizer = og.Tokenizer(model)
    engine = og.Engine(model)

    def chat(text: str) -> np.ndarray:
        prompt = tokenizer.apply_chat_template(
            messages=json.dumps([{"role": "user", "content": text}]), add_generation_prompt=True
        )
        return np.asarray(tokenizer.encode(prompt), dtype=np.int32)

    def request(session: int = 0):
        options = og.RequestOptions()
        options.set_max_session_tokens(session)
        return engine.create_request(options=options)

    def turn(req, max_tokens: int):
        options = og.TurnOptions(req)
        options.set_max_generated_tokens(max_tokens)
        return options

    names: dict[int, str] = {}
    log: list = []

    def pump(capacity: int = 8, act=None) -> None:
        buffer = engine.create_event_buffer(capacity)
        while engine.has_pending_requests():
            events = engine.run(buffer)
            log.append([_record(names, e) for e in events])
            for event in list(events):
                if act is not None:
                    act(names[id(event.request)], event)

    a, b = request(), request()
    names.update({id(a): "A", id(b): "B"})
    a.begin_turn(chat("What is the capital of France?"), turn(a, 6))
    state = {"b": 0}

    def first_phase(name: str, event) -> None:
        finished = bool(event.flags & og.EngineEventFlags.TURN_FINISHED)
        if name == "A" and state["b"] == 0:  # B arrives while A decodes
            state["b"] = 1
            b.begin_turn(chat("Name a color."), turn(b, 20))
        if name == "A" and finished and event.turn_id == 1:
            a.begin_turn(chat("And of Italy?")[1:], turn(a, 4))
        if name == "B" and event.turn_id == 1 and event.token is not None and state["b"] == 1:
            state["b"] = 2
            log.append(("cancel", b.cancel_turn(1), b.cancel_turn(1), b.cancel_turn(9)))
        if name == "B" and finished and event.turn_id == 1:
            b.begin_turn(np.asarray([28, 339], dtype=np.int32), turn(b, 3))

    pump(act=first_phase)
    b.rewind_to_start_of_turn(2)  # B is alone in its batch: the reference rewinds only then
    log.append(("rewound B, turn", b.begin_turn(np.asarray([28, 339], dtype=np.int32), turn(b, 3))))
    pump()

    c, d = request(session=len(chat("Count to ten.")) + 4), request()
    names.update({id(c): "C", id(d): "D"})
    c.begin_turn(chat("Count to ten."))
    guided = og.TurnOptions(d)
    guided.set_guidance("regex", "(yes|no)")
    guided.set_max_generated_tokens(8)
    d.begin_turn(chat("Is the sky blue?"), guided)
    pump(capacity=1)  # one event per call: retained events drain before the next step

    e, f = request(), request()
    names.update({id(e): "E", id(f): "F"})
    e.begin_turn(chat("Say hello."), turn(e, 5))
    f.begin_turn(chat("Say goodbye."), turn(f, 5))
    buffer = engine.create_event_buffer(1)
    first = engine.run(buffer)  # E's token; F's waits in the engine
    log.append([(names[id(x.request)], x.token) for x in first])
    log.append(("cancel F", f.cancel_turn(1)))  # merges into F's undelivered token event
    pump()
    for req in (a, b, c, d, e, f):
        req.close()
    log.append(("pending after close", engine.has_pending_requests()))
    return log


def test_a_conversation_script_gives_the_reference_events_call_by_call() -> None:
    model_dir = str(require_shared("models", "smollm2-135m-instruct-int4-2layers"))
    ref = _reference()
    expected = conversation(ref, model_dir)
    actual = conversation(genai_runtime, model_dir)
    assert actual == expected
    flat = [e for call in expected if isinstance(call, list) for e in call]
    reasons = {e[4] for e in flat if isinstance(e, tuple) and len(e) > 4}
    # the script reaches every finish reason this CPU engine can give
    assert {"MAX_GENERATED_TOKENS", "CANCELLED", "MAX_SESSION_TOKENS", "EOS"} <= reasons


def test_the_reference_engine_names_all_exist() -> None:
    ref = _reference()
    assert [n for n in ENGINE_NAMES if not hasattr(ref, n)] == []  # the list is the reference's
    assert [n for n in ENGINE_NAMES if not hasattr(genai_runtime, n)] == []
    for name in ("FinishReason", "EngineEventFlags", "EngineErrorCode"):
        assert list(getattr(genai_runtime, name).__members__) == list(
            getattr(ref, name).__members__
        )
        assert [int(v) for v in getattr(genai_runtime, name).__members__.values()] == [
            int(v) for v in getattr(ref, name).__members__.values()
        ]
