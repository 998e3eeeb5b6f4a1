"""EOS handling matches onnxruntime-genai 0.18 step by step, run side by side with it.

The reference reports the token that finishes the last row through ``get_next_tokens`` but never
appends it: ``get_sequence`` and ``token_count`` exclude it. A row that ends while others go on
keeps its EOS and is padded afterwards.
"""

from __future__ import annotations

import importlib
import json
import os

import numpy as np
import pytest
from conftest import require_shared

import genai_runtime

QUESTION = "Explain photosynthesis in one sentence."


def _reference():
    if os.environ.get("CI", "").lower() == "true":
        return importlib.import_module("onnxruntime_genai")
    return pytest.importorskip("onnxruntime_genai")


def _chat_ids(og, model) -> np.ndarray:
    tokenizer = og.Tokenizer(model)
    messages = json.dumps([{"role": "user", "content": QUESTION}])
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return np.asarray(tokenizer.encode(text), dtype=np.int32)


def _trace(generator) -> list[tuple[list[int], int, bool]]:
    """Per step: next tokens, token_count, is_done."""
    steps = []
    while not generator.is_done():
        generator.generate_next_token()
        steps.append(
            ([int(t) for t in generator.get_next_tokens()], generator.token_count(),
             generator.is_done())
        )  # fmt: skip
    return steps


def _smollm2_run(og, max_length: int = 100):
    model = og.Model(str(require_shared("models", "smollm2-135m-instruct-int4")))
    ids = _chat_ids(og, model)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=max_length)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    return generator, ids


def test_eos_is_reported_but_not_in_the_sequence_like_the_reference() -> None:
    ref = _reference()
    ours, ids = _smollm2_run(genai_runtime)
    theirs, ref_ids = _smollm2_run(ref)
    assert ids.tolist() == ref_ids.tolist()
    ours_steps, ref_steps = _trace(ours), _trace(theirs)
    assert ours_steps == ref_steps
    sequence = ours.get_sequence(0)
    assert sequence.tolist() == theirs.get_sequence(0).tolist()
    assert ours.token_count() == theirs.token_count() == len(sequence)
    eos = set(ours.model.spec.tokens.eos)
    last_next = ours_steps[-1][0][0]
    assert last_next in eos, "generation should end on EOS well before max_length 100"
    assert len(sequence) < 100 and int(sequence[-1]) not in eos
    # The EOS step leaves the count where the previous step put it.
    assert ours_steps[-1][1] == ours_steps[-2][1] == len(sequence)


def test_after_eos_generate_pads_and_rewind_to_the_end_keeps_it_done() -> None:
    ref = _reference()
    runs = []
    for og in (genai_runtime, ref):
        generator, _ = _smollm2_run(og)
        _trace(generator)
        count = generator.token_count()
        generator.generate_next_token()  # allowed after done: pads, appends nothing
        after = ([int(t) for t in generator.get_next_tokens()], generator.token_count())
        generator.rewind_to(count)  # a no-op: still done
        runs.append((count, after, generator.is_done(), generator.get_sequence(0).tolist()))
    assert runs[0] == runs[1]
    assert runs[0][2] is True
    generator, _ = _smollm2_run(genai_runtime)
    _trace(generator)
    with pytest.raises(genai_runtime.GenerationError, match="ended on EOS"):
        generator.get_logits()


def test_rewind_after_eos_regenerates_the_same_reply() -> None:
    """EOS ids inside a chat prompt (<|im_end|>) must not end the reply generated after a
    rewind; the reply ends on the same EOS as before, not in the sequence."""
    generator, ids = _smollm2_run(genai_runtime)
    _trace(generator)
    first = generator.get_sequence(0).tolist()
    eos = set(generator.model.spec.tokens.eos)
    assert eos & set(ids.tolist()), "the chat prompt should contain an EOS id"
    n = len(ids)
    for length in (len(first) - 3, n):
        generator.rewind_to(length)
        assert not generator.is_done() and generator.token_count() == length
        steps = _trace(generator)
        sequence = generator.get_sequence(0).tolist()
        assert len(steps) > 2 and steps[-1][0][0] in eos and sequence[-1] not in eos
        # The reference is a fresh generator making the same passes through the public API:
        # int4 kernels round a pass of M tokens differently from M one-token passes (on some
        # CPUs enough to flip a near-tie further on), so the passes must match, not just tokens.
        # Into the reply: the prompt's prefill, then every kept reply token alone.
        # To the prompt: its prefill, one step, then the prompt's last token again alone.
        if length > n:
            fresh = _fresh_passes(generator.model, ids, *([t] for t in first[n:length]))
            assert fresh == first  # replaying the first run's passes gives its reply
        else:
            fresh = _fresh_passes(generator.model, ids, "step", n)
        assert sequence == fresh
        first = sequence


def _fresh_passes(model, *passes) -> list[int]:
    params = genai_runtime.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=100)
    generator = genai_runtime.Generator(model, params)
    for step in passes:
        if isinstance(step, str):  # "step"
            generator.generate_next_token()
        elif isinstance(step, int):
            generator.rewind_to(step)
        else:
            generator.append_tokens(np.asarray(step, np.int32))
    _trace(generator)
    return generator.get_sequence(0).tolist()


def test_streaming_yields_the_eos_last_and_text_matches_the_reference() -> None:
    ref = _reference()
    ours, ids = _smollm2_run(genai_runtime)
    streamed = list(ours)
    assert streamed[:-1] == ours.get_sequence(0)[len(ids) :].tolist()
    assert streamed[-1] in ours.model.spec.tokens.eos
    # The reference's streaming loop, decoding every next token (the EOS too).
    theirs, _ = _smollm2_run(ref)
    model = ref.Model(str(require_shared("models", "smollm2-135m-instruct-int4")))
    ref_stream = ref.Tokenizer(model).create_stream()
    ref_text = ""
    while not theirs.is_done():
        theirs.generate_next_token()
        ref_text += ref_stream.decode(int(theirs.get_next_tokens()[0]))
    messages = [{"role": "user", "content": QUESTION}]
    ours_text = "".join(ours.model.generate(messages, max_length=100, do_sample=False))
    assert ours_text == ref_text


# gpt2 fixture, batch of 2, greedy rows: [.., 52] -> 204 204 ...; [.., 731] -> 731 114 114 ...
BATCH_PROMPT = [[0, 0, 0, 52], [0, 0, 195, 731]]


def _gpt2_batch(og, eos: list[int], pad: int):
    config = og.Config(
        str(require_shared("fixtures", "onnxruntime-genai", "tiny-random-gpt2-fp32"))
    )
    config.overlay(json.dumps({"model": {"eos_token_id": eos, "pad_token_id": pad}}))
    model = og.Model(config)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=10, batch_size=2)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array(BATCH_PROMPT, dtype=np.int32))
    steps = _trace(generator)
    return steps, [generator.get_sequence(i).tolist() for i in range(2)], generator.token_count()


@pytest.mark.parametrize(
    ("eos", "pad"),
    [
        ([731], 98),  # row 1 ends on the first step and is padded with 98
        ([114], 0),  # row 1 ends on the second step, pad 0
        ([204], 98),  # row 0 ends first; row 1 runs to max_length
        ([731, 204], 98),  # both end on the same (first) step: nothing appended
        ([114, 204], 98),  # row 0 ends, then row 1: the last step is not appended
        ([52], 98),  # an EOS id only in the prompt never ends a row
    ],
)
def test_batch_rows_ending_at_different_steps_match_the_reference(eos, pad) -> None:
    ref = _reference()
    ours = _gpt2_batch(genai_runtime, eos, pad)
    assert ours == _gpt2_batch(ref, eos, pad)
    _, sequences, count = ours
    assert all(len(s) == count for s in sequences)
