"""The 0.18 Engine API's prompt cache on real models: a script of requests sharing a long system
prompt (begun together, begun later, continued, evicted and resumed) gives the same greedy tokens
with the cache on and off, while later requests copy the shared rows (the cache's stats and
``TurnUsage.cached_prompt_tokens`` say how many).

Exactness is checked on an fp32 folder imported from a tiny GGUF, and on the shared int4 folder
(MatMulNBits at accuracy level 4: a one-row pass rounds differently there, and the engine always
prefills at least two tokens, so a copy changes no pass).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import AGENT_SYSTEM as SYSTEM
from conftest import require_shared

import genai_runtime as og

SMALL = "smollm2-135m-instruct-int4-2layers"


@pytest.fixture(scope="module")
def fp32_folder(tiny_fp32_folder: Path) -> Path:
    return tiny_fp32_folder


def _prompt(tokenizer: og.Tokenizer, task: str) -> np.ndarray:
    if not tokenizer.has_chat_template:  # the tiny GGUF's vocabulary: plain text
        return np.asarray(tokenizer.encode(SYSTEM + task), np.int32)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    text = tokenizer.apply_chat_template(json.dumps(messages), add_generation_prompt=True)
    return np.asarray(tokenizer.encode(text), np.int32)


def _drain(engine: og.Engine, out: dict) -> None:
    buffer = engine.create_event_buffer(8)
    while engine.has_pending_requests():
        for e in engine.run(buffer):
            entry = out.setdefault(e.request, {"tokens": [], "cached": []})
            if e.flags & og.EngineEventFlags.TOKEN:
                entry["tokens"].append(e.token)
            if e.flags & og.EngineEventFlags.TURN_FINISHED:
                entry["cached"].append(e.usage.cached_prompt_tokens)


def _script(model: og.Model, mb: int) -> tuple[list, list, og.Engine]:
    """Requests over one system prompt; returns every request's tokens and cached counts."""
    engine = og.Engine(model, prompt_cache_mb=mb)
    tokenizer = og.Tokenizer(model)
    out: dict = {}

    def begin(req, tokens, n: int = 8) -> None:
        options = og.TurnOptions(req)
        options.set_max_generated_tokens(n)
        req.begin_turn(tokens, options)

    a, b = engine.create_request(), engine.create_request()
    begin(a, _prompt(tokenizer, "Task alpha: list the files."))  # one batch: neither finds
    begin(b, _prompt(tokenizer, "Task beta: run the tests."))  # the other's rows yet
    _drain(engine, out)
    c = engine.create_request()
    begin(c, _prompt(tokenizer, "Task gamma: fix the bug."))  # a later batch: copies them
    _drain(engine, out)
    begin(a, np.asarray(tokenizer.encode(" Now step two."), np.int32))  # A continues, resident
    _drain(engine, out)
    others = [engine.create_request() for _ in range(4)]  # every slot: A is evicted
    for i, req in enumerate(others):
        begin(req, _prompt(tokenizer, f"Task {i}: something else."), 2)
    _drain(engine, out)
    begin(a, np.asarray(tokenizer.encode(" And step three."), np.int32))  # re-placed
    _drain(engine, out)
    requests = [a, b, c, *others]
    return [out[r]["tokens"] for r in requests], [out[r]["cached"] for r in requests], engine


@pytest.mark.parametrize("which", ["fp32", "int4-level4"])
def test_greedy_tokens_equal_with_the_engine_cache_on_and_off(which, fp32_folder) -> None:
    folder = fp32_folder if which == "fp32" else require_shared("models", SMALL)
    model = og.Model(str(folder))
    want, none, plain = _script(model, 0)
    assert plain.prompt_cache is None and "off" in plain.prompt_cache_note
    assert not any(any(c) for c in none)
    got, cached, engine = _script(model, 64)
    assert got == want
    stats = engine.prompt_cache.stats
    assert cached[0][0] == cached[1][0] == 0  # begun together: nothing offered yet
    assert cached[2][0] >= 32 and cached[2][0] % 32 == 0  # C copies the shared blocks
    assert all(c[0] >= 32 for c in cached[3:])
    assert cached[0][1:] == [0, 0]  # A's later inputs: its own rows (resident, then cached)
    assert (stats.lookups, stats.hits) == (8, 6)  # A, re-placed, copies its own prompt
    assert stats.hit_tokens >= 6 * 32 and stats.stored_blocks > 0


def test_the_cache_is_off_at_zero_and_refuses_a_bad_budget() -> None:
    model = og.Model(str(require_shared("models", SMALL)))
    engine = og.Engine(model)
    assert engine.prompt_cache is not None and engine.prompt_cache.budget == 512 << 20
    assert og.Engine(model, prompt_cache_mb=0).prompt_cache is None
    for bad in (-1, 1.5, "64"):
        with pytest.raises(TypeError, match="prompt_cache_mb"):
            og.Engine(model, prompt_cache_mb=bad)
