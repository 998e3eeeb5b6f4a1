"""Samplers: exact distributions (from the definitions) and goodness of fit of the draws.

Chi-square tests use fixed seeds, so they are deterministic; the 1e-3 threshold only says how
far from the expected counts a correct sampler may land, and a negative control shows the
test has the power to reject a wrong distribution.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import chisquare

from genai_runtime.decoding.sampling import (
    SamplingError,
    draw,
    greedy,
    sample,
    sampling_distribution,
)
from genai_runtime.errors import GenaiRuntimeError

P_MIN = 1e-3
DRAWS = 20_000


def definition(logits, *, top_k, top_p, temperature, min_p=0.0):
    """{id: prob} from the textbook definitions, one token at a time (exact nucleus)."""
    x = [float(v) for v in logits]
    order = sorted(range(len(x)), key=lambda i: (-x[i], i))
    if top_k > 1:
        order = order[: min(top_k, len(x))]
    weights = [math.exp((x[i] - x[order[0]]) / temperature) for i in order]
    total = sum(weights)
    probs = [w / total for w in weights]
    if top_k <= 1 or 0.0 < top_p < 1.0:  # nucleus: shortest prefix reaching top_p
        cum = 0.0
        for j, p in enumerate(probs):
            cum += p
            if cum >= top_p:
                order, probs = order[: j + 1], probs[: j + 1]
                break
    if min_p > 0.0:
        kept = [(i, p) for i, p in zip(order, probs, strict=True) if p >= min_p * probs[0]]
        order, probs = [i for i, _ in kept], [p for _, p in kept]
    total = sum(probs)
    return {i: p / total for i, p in zip(order, probs, strict=True)}


def reference_find_nucleus(logits, top_p, temperature):
    """Literal transcription of the reference's FindNucleus rule (one token at a time)."""
    x = np.asarray(logits, dtype=np.float64)
    size = x.size
    order = sorted(range(size), key=lambda i: (-x[i], i))
    top = x[order[0]]
    weights = [math.exp((x[i] - top) / temperature) for i in order]
    if size <= 64:
        total, cum = sum(weights), 0.0
        for i, w in enumerate(weights):
            cum += w
            if cum >= top_p * total:
                return order[: i + 1]
        return order
    prefix = 0.0
    for i, w in enumerate(weights):
        prefix += w
        if prefix >= top_p * (prefix + (size - i - 1) * w):
            return order[: i + 1]
    return order


def as_dict(ids, probs):
    assert ids.dtype == np.int32 and probs.dtype == np.float64
    assert len(set(ids.tolist())) == len(ids)
    return dict(zip(ids.tolist(), probs.tolist(), strict=True))


def assert_close(got: dict, expected: dict):
    assert list(got) == list(expected)  # same ids, same (descending) order
    np.testing.assert_allclose(list(got.values()), list(expected.values()), rtol=1e-9, atol=1e-12)


# A fixed V=12 row whose cumulative probabilities sit well away from the top_p values used.
SMALL = np.array([1.3, -0.4, 2.1, 0.2, -1.5, 0.9, 2.6, -0.8, 0.5, 1.7, -2.2, 0.0], dtype=np.float32)

CONFIGS = {
    "top_k": dict(top_k=5, top_p=1.0, temperature=1.0),
    "top_p": dict(top_k=0, top_p=0.8, temperature=1.0),
    "top_k+top_p": dict(top_k=6, top_p=0.7, temperature=1.0),
    "temperature_0.5": dict(top_k=0, top_p=1.0, temperature=0.5),
    "temperature_1": dict(top_k=0, top_p=1.0, temperature=1.0),
    "temperature_2": dict(top_k=0, top_p=1.0, temperature=2.0),
    "min_p": dict(top_k=0, top_p=1.0, temperature=1.0, min_p=0.2),
    "top_k+min_p+temperature": dict(top_k=8, top_p=1.0, temperature=0.7, min_p=0.1),
}


def test_small_row_is_unambiguous():
    # The nucleus cut points must not be within rounding of top_p for the definition to be exact.
    for config in CONFIGS.values():
        if not 0.0 < config["top_p"] < 1.0:
            continue
        x = np.sort(SMALL.astype(np.float64))[::-1]
        if config["top_k"] > 1:
            x = x[: config["top_k"]]
        p = np.exp((x - x[0]) / config["temperature"])
        cum = np.cumsum(p / p.sum())
        assert np.min(np.abs(cum - config["top_p"])[:-1]) > 1e-3


# --- exact distributions ---------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_distribution_matches_definition(name):
    config = CONFIGS[name]
    assert_close(as_dict(*sampling_distribution(SMALL, **config)), definition(SMALL, **config))


def test_method_selection_follows_reference():
    row = SMALL
    # top_k > 1 with top_p outside (0, 1): plain top-k (the reference only cuts for 0 < p < 1).
    assert len(sampling_distribution(row, top_k=3, top_p=0.0, temperature=1.0)[0]) == 3
    assert len(sampling_distribution(row, top_k=3, top_p=1.0, temperature=1.0)[0]) == 3
    # top_k larger than the vocabulary is clamped.
    assert len(sampling_distribution(row, top_k=100, top_p=1.0, temperature=1.0)[0]) == 12
    # top_k <= 1: nucleus over the full vocabulary (ComputeSampledCategorical).
    for k in (0, 1):
        got = as_dict(*sampling_distribution(row, top_k=k, top_p=0.8, temperature=1.0))
        assert_close(got, definition(row, top_k=0, top_p=0.8, temperature=1.0))
    # Nucleus with top_p = 0 keeps only the argmax.
    ids, probs = sampling_distribution(row, top_k=0, top_p=0.0, temperature=1.0)
    assert ids.tolist() == [int(np.argmax(row))] and probs.tolist() == [1.0]


def test_ties_prefer_lower_ids():
    row = np.array([1.0, 3.0, 3.0, 0.0, 3.0, 3.0], dtype=np.float32)
    ids, probs = sampling_distribution(row, top_k=3, top_p=1.0, temperature=1.0)
    assert ids.tolist() == [1, 2, 4]
    np.testing.assert_allclose(probs, [1 / 3] * 3)
    assert greedy(row[None, :]).tolist() == [1]


@pytest.mark.parametrize("seed", range(3))
def test_large_vocab_top_k_matches_definition(seed):
    rng = np.random.default_rng(seed)
    row = (rng.standard_normal(5000) * 2).astype(np.float32)
    row[rng.choice(5000, 40)] = row.max()  # ties at the top, across the k boundary
    for config in (
        dict(top_k=50, top_p=1.0, temperature=1.0),
        dict(top_k=50, top_p=0.6, temperature=0.7),
        dict(top_k=25, top_p=1.0, temperature=1.3, min_p=0.05),
    ):
        assert_close(as_dict(*sampling_distribution(row, **config)), definition(row, **config))


def test_large_vocab_nucleus_uses_reference_tail_bound():
    # A flat row: the reference's bound keeps more than the exact nucleus; ours must agree
    # with the reference's rule, not with the textbook.
    row = np.linspace(0.0, -3.0, 1000).astype(np.float32)
    ids, probs = sampling_distribution(row, top_k=0, top_p=0.5, temperature=1.0)
    expected = reference_find_nucleus(row, 0.5, 1.0)
    exact = definition(row, top_k=0, top_p=0.5, temperature=1.0)
    assert ids.tolist() == expected
    assert len(ids) == 359 and len(exact) == 215
    weights = np.exp(row[ids].astype(np.float64))
    np.testing.assert_allclose(probs, weights / weights.sum(), rtol=1e-12)

    # Peaked rows (real LLM output): bound and exact nucleus coincide.
    rng = np.random.default_rng(5)
    for _ in range(5):
        row = (rng.standard_normal(3000) * 4).astype(np.float32)
        for temperature in (0.6, 1.0):
            ids, _ = sampling_distribution(row, top_k=0, top_p=0.9, temperature=temperature)
            assert ids.tolist() == reference_find_nucleus(row, np.float32(0.9), temperature)


def test_full_vocab_nucleus_with_top_p_one_is_softmax():
    rng = np.random.default_rng(11)
    row = (rng.standard_normal(2000) * 2).astype(np.float32)
    ids, probs = sampling_distribution(row, top_k=0, top_p=1.0, temperature=1.5)
    assert sorted(ids.tolist()) == list(range(2000))
    w = np.exp((row.astype(np.float64) - row.max()) / np.float32(1.5))
    np.testing.assert_allclose(probs, (w / w.sum())[ids], rtol=1e-9)


def test_top_p_is_compared_as_float32_like_the_reference():
    # Uniform over 10: cumulative 0.9 after 9 tokens in exact arithmetic; in float64 the running
    # sum is 0.8999999999999999, but the reference stores top_p=0.9 as float32 (0.89999998).
    row = np.zeros(10, dtype=np.float32)
    assert len(sampling_distribution(row, top_k=0, top_p=0.9, temperature=1.0)[0]) == 9
    assert len(sampling_distribution(row, top_k=10, top_p=0.9, temperature=1.0)[0]) == 9


# --- sampling --------------------------------------------------------------------------------


_DRAWN: dict[str, np.ndarray] = {}


def _draws(name):
    """DRAWS tokens sampled from SMALL under CONFIGS[name] (fixed seed; shared by tests)."""
    if name not in _DRAWN:
        logits = np.broadcast_to(SMALL, (DRAWS, SMALL.size))
        _DRAWN[name] = sample(logits, rng=np.random.default_rng(1234), **CONFIGS[name])
    return _DRAWN[name]


# temperature 1 is exercised by the top_k / top_p / top_k+top_p draws.
@pytest.mark.parametrize("name", [n for n in CONFIGS if n != "temperature_1"])
def test_draws_fit_the_definition(name):
    config = CONFIGS[name]
    expected = definition(SMALL, **config)
    tokens = _draws(name)
    assert tokens.dtype == np.int32 and tokens.shape == (DRAWS,)
    counts = np.bincount(tokens, minlength=SMALL.size)
    excluded = [i for i in range(SMALL.size) if i not in expected]
    assert counts[excluded].sum() == 0, "a truncated token was drawn"
    kept = list(expected)
    if len(kept) > 1:
        result = chisquare(counts[kept], np.array([expected[i] for i in kept]) * DRAWS)
        assert result.pvalue > P_MIN, (name, result)


def test_chi_square_has_power_negative_control():
    tokens = _draws("temperature_0.5")
    counts = np.bincount(tokens, minlength=SMALL.size)
    wrong = definition(SMALL, top_k=0, top_p=1.0, temperature=1.0)
    result = chisquare(counts, np.array([wrong[i] for i in range(SMALL.size)]) * DRAWS)
    assert result.pvalue < 1e-12


def test_sample_draws_exactly_from_sampling_distribution():
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((6, 300)) * 2).astype(np.float32)
    config = dict(top_k=40, top_p=0.85, temperature=0.8, min_p=0.02)
    got = sample(logits, rng=np.random.default_rng(99), **config)
    replay = np.random.default_rng(99)
    expected = [draw(*sampling_distribution(r, **config), replay) for r in logits]
    assert got.tolist() == expected


def test_seeded_runs_are_reproducible():
    flat = np.zeros((64, 1000), dtype=np.float32)
    config = dict(top_k=0, top_p=1.0, temperature=1.0)
    a = sample(flat, rng=np.random.default_rng(7), **config)
    b = sample(flat, rng=np.random.default_rng(7), **config)
    c = sample(flat, rng=np.random.default_rng(8), **config)
    assert a.tolist() == b.tolist()
    assert a.tolist() != c.tolist()
    assert len(set(a.tolist())) > 40  # and it really samples


def test_rows_are_independent_distributions():
    logits = np.full((3, 8), -20.0, dtype=np.float32)
    logits[0, 1] = logits[1, 5] = logits[2, 7] = 10.0
    got = sample(logits, top_k=3, top_p=1.0, temperature=1.0, rng=np.random.default_rng(0))
    assert got.tolist() == [1, 5, 7]


def test_greedy():
    logits = np.array([[0.0, 2.0, 2.0, 1.0], [5.0, -1.0, 5.0, 5.0]], dtype=np.float32)
    got = greedy(logits)
    assert got.dtype == np.int32 and got.tolist() == [1, 0]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=0.0),
        dict(temperature=-1.0),
        dict(temperature=float("nan")),
        dict(temperature=float("inf")),
        dict(top_p=-0.1),
        dict(top_p=1.5),
        dict(top_p=float("nan")),
        dict(top_k=-1),
        dict(top_k=2.5),
        dict(top_k=True),
        dict(min_p=-0.1),
        dict(min_p=1.5),
    ],
)
def test_bad_parameters_raise(kwargs):
    config = dict(top_k=5, top_p=0.9, temperature=1.0) | kwargs
    with pytest.raises(SamplingError) as info:
        sample(SMALL[None, :], rng=np.random.default_rng(0), **config)
    assert isinstance(info.value, GenaiRuntimeError) and isinstance(info.value, ValueError)
    name = next(iter(kwargs))
    assert name in str(info.value)
    with pytest.raises(SamplingError):
        sampling_distribution(SMALL, **config)


def test_bad_inputs_raise():
    config = dict(top_k=5, top_p=0.9, temperature=1.0)
    with pytest.raises(SamplingError, match="rng"):
        sample(SMALL[None, :], rng=np.random.RandomState(0), **config)
    with pytest.raises(SamplingError, match="shape"):
        sample(SMALL, rng=np.random.default_rng(0), **config)
    with pytest.raises(SamplingError, match="finite"):
        sampling_distribution(np.full(4, -np.inf, np.float32), **config)
    with pytest.raises(SamplingError, match="finite"):
        sampling_distribution(np.array([0.0, np.nan], np.float32), **config)


# --- cross-check with onnxruntime-genai 0.18 draws -------------------------------------------


@pytest.fixture(scope="module")
def og_draws(gpt2_dir):
    og = pytest.importorskip("onnxruntime_genai")
    model = og.Model(str(gpt2_dir))

    def run(row, *, steps=160, batch=32, **options):
        params = og.GeneratorParams(model)
        params.set_search_options(
            max_length=steps + 2, batch_size=batch, do_sample=True, random_seed=321, **options
        )
        generator = og.Generator(model, params)
        generator.append_tokens(np.full((batch, 1), 5, dtype=np.int32))
        logits = np.ascontiguousarray(np.broadcast_to(row, (batch, 1, row.size)))
        out = []
        for step in range(steps):
            if step:
                generator.get_logits()  # set_logits needs computed logits to replace
            generator.set_logits(logits)
            generator.generate_next_token()
            out.append(np.asarray(generator.get_next_tokens()).copy())
        return np.concatenate(out)

    return run


@pytest.mark.parametrize(
    ("row_kind", "config"),
    [
        ("flat", dict(top_k=0, top_p=0.5, temperature=1.0)),
        ("peaked", dict(top_k=20, top_p=0.8, temperature=0.7)),
    ],
)
def test_reference_runtime_draws_fit_our_distribution(og_draws, row_kind, config):
    if row_kind == "flat":
        row = np.linspace(0.0, -3.0, 1000).astype(np.float32)
    else:
        row = (np.random.default_rng(17).standard_normal(1000) * 2).astype(np.float32)
    row[98] = -1e4  # EOS: a row that draws it is padded with it from then on
    ids, probs = sampling_distribution(row, **config)
    tokens = og_draws(row, **config)
    assert set(tokens.tolist()) <= set(ids.tolist()), "reference drew outside our kept set"
    counts = np.bincount(tokens, minlength=row.size)[ids]
    result = chisquare(counts, probs * tokens.size)
    assert result.pvalue > P_MIN, result
    if row_kind == "flat":
        # The reference draws beyond the exact nucleus: the tail bound is real.
        exact = definition(row, top_k=0, top_p=0.5, temperature=1.0)
        assert len(ids) > len(exact) + 100
        assert len(set(tokens.tolist()) - set(exact)) > 100
