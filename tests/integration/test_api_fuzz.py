"""Hypothesis over the public API on the real 2-layer SmolLM2: random argument types and values
for every public method, in random orders (after is_done(), after errors, past max_length).

Properties: only ``GenaiRuntimeError`` subclasses escape; a Generator that raised stays usable:
``rewind_to(0)`` and the same prompt then give exactly a fresh generator's tokens.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Any

import numpy as np
from conftest import require_shared
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import genai_runtime as og
from genai_runtime.errors import GenaiRuntimeError

PROMPT = [504, 1398, 282, 5574, 42, 11977, 28, 21285, 28]
MAX_LENGTH = 20
CHECK_TOKENS = 4


@functools.cache
def model() -> og.Model:
    return og.Model(require_shared("models", "smollm2-135m-instruct-int4-2layers"))


@functools.cache
def tokenizer() -> og.Tokenizer:
    return og.Tokenizer(model())


@functools.cache
def fresh_tokens() -> list[int]:
    generator = _generator()
    generator.append_tokens(PROMPT)
    for _ in range(CHECK_TOKENS):
        generator.generate_next_token()
    return generator.get_sequence(0).tolist()


def _generator() -> og.Generator:
    params = og.GeneratorParams(model())
    params.set_search_options(max_length=MAX_LENGTH, min_length=MAX_LENGTH)
    return og.Generator(model(), params)


# Any value a caller might pass by mistake, wrong types included.
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.integers(-3, 60),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 1.5, 0.0]),
    st.text(max_size=6),
    st.binary(max_size=4),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=3), inner, max_size=3),
        st.tuples(inner, inner),
    ),
    max_leaves=8,
)
token_lists = st.one_of(
    st.lists(st.integers(0, 49151), min_size=1, max_size=5),
    st.lists(st.lists(st.integers(-2, 60000), max_size=3), max_size=3),
    st.builds(np.array, st.lists(st.integers(0, 49151), min_size=1, max_size=4)),
    values,
)
arrays = st.one_of(
    values,
    st.builds(lambda n: np.zeros(n, np.float32), st.integers(0, 3)),
    st.builds(lambda: np.zeros(49152, np.float32)),
    st.builds(lambda: np.full((1, 49152), np.nan, np.float32)),
)
names = st.one_of(st.sampled_from(["input_ids", "logits", "attention_mask", "nope"]), values)
search_keys = st.sampled_from(
    ["max_length", "min_length", "top_k", "top_p", "temperature", "do_sample", "batch_size",
     "num_beams", "random_seed", "repetition_penalty", "chunk_size", "bogus"]
)  # fmt: skip


def _kv_rows(n: int) -> np.ndarray:
    """Rows of the 2-layer model's shape (4 tensors, 3 heads, head size 64) for ``n`` tokens."""
    return np.zeros((4, 3, n, 64), np.float32)


calls = st.one_of(
    st.tuples(st.just("append_tokens"), token_lists),
    st.tuples(st.just("generate_next_token")),
    st.tuples(st.just("generate_next_token")),
    st.tuples(st.just("is_done")),
    st.tuples(st.just("get_next_tokens")),
    st.tuples(st.just("get_sequence"), st.one_of(st.integers(-2, 2), values)),
    st.tuples(st.just("token_count")),
    st.tuples(st.just("get_logits")),
    st.tuples(st.just("set_logits"), arrays),
    st.tuples(st.just("rewind_to"), st.one_of(st.integers(-2, 25), values)),
    st.tuples(st.just("get_output"), names),
    st.tuples(st.just("get_input"), names),
    st.tuples(st.just("set_model_input"), names, arrays),
    st.tuples(st.just("read_kv"), st.one_of(st.integers(-2, 25), values), st.integers(-2, 25)),
    st.tuples(
        st.just("append_kv"), token_lists, st.one_of(arrays, st.builds(_kv_rows, st.integers(0, 4)))
    ),
    st.tuples(st.just("next")),
    st.tuples(st.just("params"), search_keys, values),
    st.tuples(st.just("stream_decode"), st.one_of(st.integers(-5, 60000), values)),
    st.tuples(st.just("decode"), token_lists),
    st.tuples(st.just("encode"), values),
    st.tuples(st.just("chat"), values, values),
    st.tuples(st.just("new_generator"), values, values),
)


def _call(generator: og.Generator, stream: Any, call: tuple) -> None:
    name, *args = call
    if name == "next":
        next(generator, None)
    elif name == "params":
        og.GeneratorParams(model()).set_search_options(**{args[0]: args[1]})
    elif name == "stream_decode":
        stream.decode(args[0])
    elif name == "decode":
        tokenizer().decode(args[0])
    elif name == "encode":
        tokenizer().encode(args[0])
    elif name == "chat":
        tokenizer().apply_chat_template(args[0], tools=args[1])
    elif name == "new_generator":
        og.Generator(args[0], args[1])
    else:
        getattr(generator, name)(*args)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(calls, min_size=1, max_size=12))
def test_random_calls_raise_only_our_errors_and_leave_the_generator_usable(sequence) -> None:
    generator = _generator()
    stream = tokenizer().create_stream()
    for call in sequence:
        with contextlib.suppress(GenaiRuntimeError):  # anything else fails the test
            _call(generator, stream, call)
    generator.rewind_to(0)
    generator.append_tokens(PROMPT)
    for _ in range(CHECK_TOKENS):
        generator.generate_next_token()
    assert generator.get_sequence(0).tolist() == fresh_tokens()
