"""The v1 mapping and the same links written as a v2 chain, token for token against the reference.

Uses the ``smollm2-int4-penalty`` golden's prompt and options (min_length, repetition_penalty and
no_repeat_ngram_size all active) and runs onnxruntime-genai 0.18.0 beside us in this process: the
stored golden pins the reference's tokens on the machine that recorded it, and int4 kernels may
round differently on another CPU, so the side-by-side run is the exact check here.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import load_golden, require_shared

import genai_runtime as ours
from genai_runtime.spec import ProcessorSpec


def _run(generator, prompt: np.ndarray) -> list[int]:
    generator.append_tokens(prompt)
    while not generator.is_done():
        generator.generate_next_token()
    return generator.get_sequence(0).tolist()


def test_penalty_golden_v1_and_v2_chain_match_reference_side_by_side():
    og = pytest.importorskip("onnxruntime_genai")
    run = load_golden("smollm2-int4-penalty")["runs"][0]
    options = run["options"]
    folder = str(require_shared("models", "smollm2-135m-instruct-int4"))
    prompt = np.array([run["input_ids"]], np.int32)

    ref_model = og.Model(folder)
    ref_params = og.GeneratorParams(ref_model)
    ref_params.set_search_options(**options)
    reference = _run(og.Generator(ref_model, ref_params), prompt)

    model = ours.Model(folder)
    params = ours.GeneratorParams(model)
    params.set_search_options(**options)
    assert _run(ours.Generator(model, params), prompt) == reference

    # The same three links as an explicit chain, in the reference's order, ending in argmax.
    chain = ours.GeneratorParams(model)
    chain.set_search_options(max_length=options["max_length"])
    chain.search = dataclasses.replace(
        chain.search,
        logits=(
            ProcessorSpec("min_length", {"min_length": options["min_length"]}),
            ProcessorSpec("repetition_penalty", {"penalty": options["repetition_penalty"]}),
            ProcessorSpec("no_repeat_ngram", {"ngram_size": options["no_repeat_ngram_size"]}),
            ProcessorSpec("argmax"),
        ),
    )
    assert _run(ours.Generator(model, chain), prompt) == reference
