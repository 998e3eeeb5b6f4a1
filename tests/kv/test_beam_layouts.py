"""Beam search on every KV-cache layout of the tiny decoder against a NumPy beam search over a
NumPy recompute with no cache: each step's logits of every beam row (so each cache's row
reorder), the next tokens, and the returned sequences with their scores. Plus the errors."""

from __future__ import annotations

import json

import layouts as L
import numpy as np
import pytest
from beam_reference import beam_search

import genai_runtime as og
from genai_runtime.errors import GenerationError, UnsupportedError
from genai_runtime.session.device import COPY_ON_BIND

ATOL = 1e-4
PROMPTS = [[5, 9, 3, 7, 12], [4, 8]]  # the second is right-padded
EVEN = [[5, 9, 3, 7, 12], [4, 8, 6, 2, 11]]  # GroupQueryAttention's window refuses padding
BEAMS = 3
NEW = 8
WINDOW = {"window": 4, "window_layers": (0,)}


@pytest.fixture(scope="module")
def w() -> dict[str, np.ndarray]:
    out = L.weights()
    # EOS competes (the default bias of -100 rules it out): hypotheses close at several steps.
    out["lm_bias"] = out["lm_bias"].copy()
    out["lm_bias"][L.EOS] = 7.0
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory, w) -> dict[str, og.Model]:
    root = tmp_path_factory.mktemp("beam-layouts")
    out = {layout: og.Model(L.folder(root, layout, w)) for layout in L.LAYOUTS}
    # cache_slack 2: the windowed layer keeps 6 rows and evicts during the run.
    windowed = L.folder(root / "window", "share-buffer", w, cache_slack=2, **WINDOW)
    out["sliding-window"] = og.Model(windowed)
    # The device code path on the CPU provider: inputs copied when bound, rows moved by a
    # Gather graph (see tests/integration/test_device.py).
    for layout in ("concat", "share-buffer"):
        config = og.Config(root / layout)
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {COPY_ON_BIND: "1"}}}}))
        out[f"{layout} on a device"] = og.Model(config)
    return out


def _generator(model: og.Model, **options) -> og.Generator:
    params = og.GeneratorParams(model)
    params.set_search_options(**options)
    return og.Generator(model, params)


def _padded(prompts: list[list[int]]) -> np.ndarray:
    width = max(map(len, prompts))
    return np.array([p + [L.PAD] * (width - len(p)) for p in prompts], np.int64)


@pytest.mark.parametrize(
    "layout", [*L.LAYOUTS, "sliding-window", "concat on a device", "share-buffer on a device"]
)
def test_beam_search_equals_numpy_beam_search(models, w, layout) -> None:
    prompts = EVEN if layout == "sliding-window" else PROMPTS
    window = WINDOW if layout == "sliding-window" else {}
    width = max(map(len, prompts))
    options = dict(length_penalty=0.8, early_stopping=False)
    generator = _generator(
        models[layout], batch_size=2, num_beams=BEAMS, num_return_sequences=BEAMS,
        max_length=width + NEW, **options,
    )  # fmt: skip
    assert generator.kv_plan.kind == layout.removesuffix(" on a device")
    if layout.endswith("device"):
        assert not generator.kv_cache.device.host
    generator.append_tokens(_padded(prompts))

    def recompute(step: int, rows: np.ndarray, live: np.ndarray) -> np.ndarray:
        real = [prompts[r // BEAMS] + row[width:].tolist() for r, row in enumerate(rows)]
        expected = np.array([L.reference_logits(t, w, **window)[-1] for t in real])
        ours = generator.get_logits()[:, 0]  # the beams' rows, as each cache reordered them
        np.testing.assert_allclose(ours[live], expected[live], atol=ATOL, rtol=0)
        generator.generate_next_token()
        steps.append(generator.get_next_tokens().tolist())
        return expected

    steps: list[list[int]] = []
    expected = beam_search(
        recompute, _padded(prompts), num_beams=BEAMS, max_length=width + NEW, eos=[L.EOS],
        pad=L.PAD, **options,
    )  # fmt: skip
    assert generator.is_done()
    assert steps == expected.steps
    for b, hypotheses in enumerate(expected.hypotheses):
        for j, (score, tokens) in enumerate(hypotheses):
            assert generator.get_sequence(b * BEAMS + j).tolist() == tokens
            assert generator.get_sequence_score(b * BEAMS + j) == pytest.approx(score, rel=1e-5)
    if layout == "sliding-window":
        assert generator.kv_cache.evicted
    closed_early = {len(t) for h in expected.hypotheses for _, t in h}
    assert min(closed_early) < width + NEW  # EOS closed hypotheses before max_length


def test_early_stopping_and_diversity_penalty(models, w) -> None:
    """early_stopping ends once num_beams hypotheses exist; diversity_penalty changes nothing
    (the reference accepts it and has no beam groups)."""
    prompt = _padded(PROMPTS[:1])

    def run(**options) -> tuple[int, list[list[int]]]:
        generator = _generator(models["concat"], num_beams=BEAMS, max_length=5 + NEW, **options)
        generator.append_tokens(prompt)
        while not generator.is_done():
            generator.generate_next_token()
        sequences = [generator.get_sequence(i).tolist() for i in range(BEAMS)]
        return generator.token_count(), sequences

    def numpy_run(step: int, rows: np.ndarray, live: np.ndarray) -> np.ndarray:
        return np.array([L.reference_logits(row.tolist(), w)[-1] for row in rows])

    for early in (True, False):
        expected = beam_search(
            numpy_run, prompt, num_beams=BEAMS, max_length=5 + NEW, eos=[L.EOS], pad=L.PAD,
            early_stopping=early,
        )  # fmt: skip
        count, sequences = run(early_stopping=early, num_return_sequences=BEAMS)
        assert count == 5 + len(expected.steps)
        assert sequences == [t for _, t in expected.hypotheses[0]]
        if early:
            assert count < 5 + NEW  # stopped before max_length
            assert run(early_stopping=True, num_return_sequences=BEAMS, diversity_penalty=2.0) == (
                count,
                sequences,
            )


def test_beam_search_errors(models) -> None:
    model = models["concat"]
    with pytest.raises(GenerationError, match=r"num_return_sequences \(3\) must be in \[1, 2\]"):
        _generator(model, num_beams=2, num_return_sequences=3, max_length=12)
    with pytest.raises(GenerationError, match=r"num_beams \(33\) must be in \[1, 32\]"):
        _generator(model, num_beams=33, max_length=12)
    with pytest.raises(GenerationError, match="cannot be used with a beam search"):
        _generator(model, num_beams=2, do_sample=True, top_k=5, max_length=12)
    generator = _generator(model, num_beams=2, do_sample=True, top_k=1, max_length=12)  # greedy
    with pytest.raises(GenerationError, match="only with beam search"):
        _generator(model, max_length=12).get_sequence_score(0)
    generator.append_tokens(PROMPTS[0])
    generator.generate_next_token()
    assert generator.get_next_tokens().shape == (2,)
    assert generator.get_logits().shape == (2, 1, L.VOCAB)
    with pytest.raises(UnsupportedError, match="rewind_to is not supported with beam search"):
        generator.rewind_to(3)
    generator.rewind_to(generator.token_count())  # the current length: nothing to do
    with pytest.raises(UnsupportedError, match="takes the prompt once"):
        generator.append_tokens([3])
    with pytest.raises(GenerationError, match=r"out of range \[0, 1\)"):
        generator.get_sequence(1)
    # Mid-run, get_sequence is a snapshot: the search goes on as if it had not been asked.
    untouched = _generator(model, num_beams=2, max_length=12)
    untouched.append_tokens(PROMPTS[0])
    untouched.generate_next_token()
    while not generator.is_done():
        generator.get_sequence(0)
        generator.generate_next_token()
        untouched.generate_next_token()
    assert untouched.is_done()
    assert generator.get_sequence(0).tolist() == untouched.get_sequence(0).tolist()
