"""Beam search side by side with onnxruntime-genai 0.18.0 in this process (int4 kernels round
differently per CPU, so never against stored goldens).

On SmolLM2 int4 (num_beams 2 and 4): every step's logits and next tokens, and every returned
sequence, equal the reference's. The reference keeps its scores internal, so they are recomputed
from its own logits by the tests' NumPy beam search (``beam_reference``), which must reproduce
its tokens step for step; our ``get_sequence_score`` equals those scores.

On the 2-layer draft model with logits set by hand each step (EOS likely, several prompts,
length penalties, early stopping on and off): the search alone, token for token against the
reference, including when a prompt's search stops, with a diversity_penalty neither side uses.
"""

from __future__ import annotations

import numpy as np
import pytest
from beam_reference import beam_search

import genai_runtime as ours

PROMPT = np.array([504, 3575, 282, 4649, 314], np.int32)  # "The capital of France is"
NEW = 6


@pytest.fixture(scope="module")
def models(smollm2_dir):
    og = pytest.importorskip("onnxruntime_genai")
    return og.Model(str(smollm2_dir)), ours.Model(str(smollm2_dir))


def _run(generator, prompt: np.ndarray, logits: list[np.ndarray] | None = None):
    """Generate to the end; the logits before each step (set by hand when ``logits`` is given)
    and the next tokens after it."""
    generator.append_tokens(prompt)
    seen, steps = [], []
    while not generator.is_done():
        current = generator.get_logits()[:, 0].copy()
        if logits is not None:
            current = logits[len(steps)]
            generator.set_logits(current)
        seen.append(current)
        generator.generate_next_token()
        steps.append(generator.get_next_tokens().tolist())
    return seen, steps


@pytest.mark.parametrize("num_beams", [2, 4])
def test_smollm2_beams_equal_the_reference(models, num_beams):
    og = pytest.importorskip("onnxruntime_genai")
    ref_model, model = models
    prompt = PROMPT
    options = dict(
        num_beams=num_beams, num_return_sequences=num_beams, max_length=len(prompt) + NEW
    )

    ref_params = og.GeneratorParams(ref_model)
    ref_params.set_search_options(**options)
    ref = og.Generator(ref_model, ref_params)
    ref_logits, ref_steps = _run(ref, prompt)
    ref_sequences = [ref.get_sequence(i).tolist() for i in range(num_beams)]

    params = ours.GeneratorParams(model)
    params.set_search_options(**options)
    generator = ours.Generator(model, params)
    logits, steps = _run(generator, prompt)
    assert steps == ref_steps
    for mine, theirs in zip(logits, ref_logits):
        np.testing.assert_allclose(mine, theirs, atol=1e-3, rtol=0)
    assert [generator.get_sequence(i).tolist() for i in range(num_beams)] == ref_sequences

    replay = beam_search(
        lambda step, rows, live: ref_logits[step], prompt[None], num_beams=num_beams,
        max_length=options["max_length"], eos=[2], pad=2,
    )  # fmt: skip
    assert replay.steps == ref_steps
    assert [tokens for _, tokens in replay.hypotheses[0]] == ref_sequences
    scores = [generator.get_sequence_score(i) for i in range(num_beams)]
    assert scores == pytest.approx([score for score, _ in replay.hypotheses[0]], rel=1e-5)


def _crafted(rng: np.random.Generator, steps: int, rows: int, vocab: int) -> list[np.ndarray]:
    """Logits with a few likely tokens per row, EOS (2) among them, and no ties (a tie would
    leave the order of candidates to each side's sort)."""
    out = []
    for _ in range(steps):
        logits = rng.normal(-30.0, 1.0, (rows, vocab)).astype(np.float32)
        hot = rng.integers(3, 40, (rows, 6))
        np.put_along_axis(logits, hot, rng.normal(0.0, 2.0, hot.shape).astype(np.float32), 1)
        logits[:, 2] = rng.normal(-0.5, 2.0, rows)
        out.append(logits)
    return out


# (seed, batch, beams, returned, early_stopping, length_penalty). The first one's stopping step
# hangs on the reference's best-candidate window (offset b * num_beams): a window at
# b * 2 * num_beams would stop it a step earlier.
CASES = [(3, 2, 2, 2, False, 1.0), (1, 2, 4, 3, True, 2.0)]


def test_search_with_logits_set_by_hand_equals_the_reference(smollm2_2layers_dir):
    og = pytest.importorskip("onnxruntime_genai")
    folder = str(smollm2_2layers_dir)
    ref_model, model = og.Model(folder), ours.Model(folder)
    for seed, batch, beams, returned, early, penalty in CASES:
        options = dict(
            batch_size=batch, num_beams=beams, num_return_sequences=returned, max_length=14,
            early_stopping=early, length_penalty=penalty,
            diversity_penalty=1.5,  # accepted by both, used by neither (no beam groups)
        )  # fmt: skip
        prompt = np.tile(np.arange(10, 14, dtype=np.int32), (batch, 1))
        logits = _crafted(np.random.default_rng(seed), 10, batch * beams, 49152)
        results = []
        for api, loaded in ((og, ref_model), (ours, model)):
            params = api.GeneratorParams(loaded)
            params.set_search_options(**options)
            generator = api.Generator(loaded, params)
            _, steps = _run(generator, prompt, logits)
            sequences = [generator.get_sequence(i).tolist() for i in range(batch * returned)]
            results.append((steps, sequences))
        assert results[1] == results[0], options
