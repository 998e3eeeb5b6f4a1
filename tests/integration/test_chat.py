"""``ChatSession`` and ``genai-runtime chat`` on the real SmolLM2 models: multi-turn chat that
keeps the KV cache between turns and prefills only the new tokens."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from genai_runtime import GenerationError, Generator, GeneratorParams, Model, Tokenizer
from genai_runtime.chat import ChatSession


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    model = Model(smollm2_dir)
    return model, Tokenizer(model)


@pytest.fixture(scope="module")
def small(smollm2_2layers_dir):
    model = Model(smollm2_2layers_dir)
    return model, Tokenizer(model)


def fresh_reply(model, ids, max_new: int, max_length: int = 256) -> list[int]:
    """Greedy tokens a new generator produces for ``ids`` (EOS included, as ChatSession keeps)."""
    params = GeneratorParams(model)
    params.set_search_options(max_length=max_length)
    generator = Generator(model, params)
    generator.append_tokens(ids)
    eos = set(model.spec.tokens.eos)
    out: list[int] = []
    while not generator.is_done() and len(out) < max_new:
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
        if out[-1] in eos:
            break
    return out


def prompt_ids(tokenizer, messages) -> np.ndarray:
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def common_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_second_turn_reuses_cache_and_matches_fresh_generation(smollm2):
    model, tokenizer = smollm2
    # Short replies: int4 MatMulNBits gives slightly different logits for a one-token pass than
    # for a multi-token prefill (onnxruntime-genai too), so long greedy runs may drift apart.
    session = ChatSession(model, tokenizer, max_length=256, max_new_tokens=12)
    first = "".join(session.send("What is the capital of France?"))
    assert first.startswith("The capital of France is Paris")
    held = session.generator.get_sequence(0)
    assert session.last_prefill_tokens == len(held) - len(session.last_reply_tokens)

    second = "".join(session.send("And of Germany?"))
    full = prompt_ids(tokenizer, session.messages[:-1])
    # Only the tokens after what the generator already held were prefilled.
    assert common_prefix(held, full) == len(held)
    assert session.last_prefill_tokens == len(full) - len(held)
    assert session.last_prefill_tokens < len(full) // 4
    # ... and the reply is what a fresh generator says to the whole conversation.
    assert session.last_reply_tokens == fresh_reply(model, full, max_new=12)
    assert "Berlin" in second
    assert session.messages[-1] == {"role": "assistant", "content": second}


def test_edited_history_rewinds_to_common_prefix(small):
    model, tokenizer = small
    session = ChatSession(model, tokenizer, system="Be brief.", max_length=256, max_new_tokens=8)
    "".join(session.send("Name a colour."))
    held = session.generator.get_sequence(0)
    session.messages[-1]["content"] = "Blue."  # not what the model said: the cache must rewind
    "".join(session.send("Another one?"))
    full = prompt_ids(tokenizer, session.messages[:-1])
    kept = common_prefix(held, full)
    assert kept < len(held)
    assert session.last_prefill_tokens == len(full) - kept
    sequence = session.generator.get_sequence(0)
    np.testing.assert_array_equal(sequence[: len(full)], full)
    assert session.last_reply_tokens == fresh_reply(model, full, max_new=8)


def test_reset_starts_over(small):
    model, tokenizer = small
    session = ChatSession(model, tokenizer, max_length=256, max_new_tokens=6)
    first = "".join(session.send("Hello!"))
    prompt_len = session.last_prefill_tokens
    "".join(session.send("And again?"))
    session.reset()
    assert session.messages == [] and session.generator.token_count() == 0
    assert "".join(session.send("Hello!")) == first
    assert session.last_prefill_tokens == prompt_len


def test_reply_closed_early_is_recorded(small):
    model, tokenizer = small
    session = ChatSession(model, tokenizer, max_length=256, max_new_tokens=8)
    reply = session.send("Tell me a story.")
    chunk = next(reply)
    reply.close()
    assert session.messages[-1] == {"role": "assistant", "content": chunk}
    assert len(session.last_reply_tokens) >= 1
    # A reply never read is superseded by the next turn: it yields nothing afterwards.
    stale = session.send("Go on.")
    fresh = session.send("Shorter, please.")
    assert list(stale) == []
    assert "".join(fresh) == session.messages[-1]["content"]
    roles = [m["role"] for m in session.messages]
    assert roles == ["user", "assistant"] * 3


def test_conversation_too_long_raises(small):
    model, tokenizer = small
    session = ChatSession(model, tokenizer, max_length=48, max_new_tokens=4)
    with pytest.raises(GenerationError, match="no longer fits max_length 48"):
        session.send("word " * 60)
    assert session.messages == []  # the failed turn left no trace
    "".join(session.send("Hi"))  # and the session still works
    assert [m["role"] for m in session.messages] == ["user", "assistant"]


def test_cli_chat_over_piped_stdin(smollm2_2layers_dir):
    stdin = "Hello there\nWhat is 2+2?\n/reset\nHi\n/quit\nnever read\n"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "genai_runtime",
            "chat",
            smollm2_2layers_dir,
            "--max-new-tokens",
            "6",
            "--max-length",
            "256",
            "--system",
            "Be brief.",
        ],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("> ")
    assert out.count("> ") == 5  # three turns, /reset, /quit; nothing after /quit runs
    assert "(conversation cleared)" in out
    replies = [part for part in out.split("> ")[1:] if part.strip()]
    assert len(replies) == 4 and all(part.endswith("\n") for part in replies)


def test_cli_chat_reports_overflow_and_continues(smollm2_2layers_dir):
    stdin = ("word " * 80) + "\nHi\n"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "genai_runtime",
            "chat",
            smollm2_2layers_dir,
            "--max-new-tokens",
            "4",
            "--max-length",
            "64",
        ],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0
    assert "error: the conversation no longer fits the context of 64 tokens" in result.stderr
    assert "--max-length" in result.stderr and "/reset" in result.stderr  # CLI words
    assert result.stdout.count("> ") == 3  # the overflow, "Hi", then EOF


def test_abandon_rewinds_to_the_last_whole_turn(small):
    model, tokenizer = small
    session = ChatSession(model, tokenizer, max_length=256, max_new_tokens=6)
    "".join(session.send("Hello!"))
    whole, before = session.generator.get_sequence(0).copy(), list(session.messages)
    reply = session.send("Tell me a story.")
    next(reply)
    assert session.abandon()
    assert session.messages == before and session.finish_reason is None
    kept = session.generator.token_count()
    assert 0 < kept <= len(whole)
    np.testing.assert_array_equal(session.generator.get_sequence(0), whole[:kept])
    assert list(reply) == [] and not session.abandon()  # the stopped reply is over
    "".join(session.send("Hi again."))
    assert [m["content"] for m in session.messages if m["role"] == "user"] == [
        "Hello!",
        "Hi again.",
    ]
    assert session.finish_reason == "length"
