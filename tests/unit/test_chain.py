"""The v2 decoding chain: each op on hand-made logits, order, validation, and sampled frequencies.

Expected values are worked out by hand (in the comments) or from the textbook definition, never
from the code under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import chisquare

from genai_runtime.decoding.chain import (
    OPS,
    VALID_OPS,
    ReferenceGreedy,
    ReferenceSample,
    check_chain,
    make_picker,
)
from genai_runtime.decoding.processors import LOWEST, BadWords, MinNewTokens
from genai_runtime.decoding.warpers import (
    Argmax,
    MinP,
    Sample,
    Temperature,
    TopK,
    TopP,
    TypicalP,
)
from genai_runtime.errors import ConfigError, GenerationError
from genai_runtime.spec import GenerationSpec, ProcessorSpec

L = LOWEST
NO_TOKENS = np.zeros((2, 0), np.int32)


def f32(rows):
    return np.array(rows, dtype=np.float32)


def chain(*entries, **generation):
    specs = tuple(ProcessorSpec(op, params) for op, params in entries)
    return make_picker(
        GenerationSpec(logits=specs, **generation), eos_token_ids=[0], vocab_size=1000
    )


# --- each op, exact ------------------------------------------------------------------------


def test_temperature_divides():
    out = Temperature(2.0)(NO_TOKENS, f32([[1, 2, 4], [-2, 0, 6]]))
    np.testing.assert_array_equal(out, f32([[0.5, 1, 2], [-1, 0, 3]]))


def test_top_k_ties_keep_lower_ids_and_rows_differ():
    out = TopK(2)(NO_TOKENS, f32([[1, 3, 3, 2], [5, 1, 5, 5]]))
    np.testing.assert_array_equal(out, f32([[L, 3, 3, L], [5, L, 5, L]]))
    same = TopK(9)(NO_TOKENS, f32([[1, 2]]))  # k >= V: nothing to cut
    np.testing.assert_array_equal(same, f32([[1, 2]]))


def test_top_p_keeps_the_shortest_prefix_reaching_p():
    rows = np.log(f32([[0.5, 0.3, 0.2], [0.1, 0.2, 0.7], [0.25, 0.25, 0.25]]))
    rows[2, :] = 0.0  # four-way tie below, three-way here: equal probabilities
    out = TopP(0.6)(NO_TOKENS, rows.copy())
    # row 0: cum 0.5, 0.8 -> two; row 1: 0.7 >= 0.6 -> one; row 2: 1/3, 2/3 -> two, lower ids
    expected = rows.copy()
    expected[0, 2] = L
    expected[1, :2] = L
    expected[2, 2] = L
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.999])
def test_top_p_on_a_large_vocabulary_matches_a_full_sort(p):
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((3, 5000)) * np.array([[0.5], [2.0], [6.0]])).astype(np.float32)
    out = TopP(p)(NO_TOKENS, logits.copy())
    for row, got in zip(logits, out, strict=True):
        probs = _softmax(row)
        order = sorted(range(row.size), key=lambda i: (-row[i], i))
        mass, kept = 0.0, []
        for i in order:
            kept.append(i)
            mass += probs[i]
            if mass >= p:
                break
        assert np.flatnonzero(got != L).tolist() == sorted(kept)


def test_min_p_drops_below_fraction_of_top():
    # relative probabilities exp(0)=1, exp(-0.5)=0.61, exp(-1)=0.37, exp(-3)=0.05
    out = MinP(0.5)(NO_TOKENS, f32([[0, -0.5, -1, -3], [-3, -1, -0.5, 0]]))
    np.testing.assert_array_equal(out, f32([[0, -0.5, L, L], [L, L, -0.5, 0]]))


def test_typical_p_orders_by_distance_to_entropy_and_may_drop_the_argmax():
    # p = (0.6, 0.3, 0.1): H = 0.898; surprisals 0.511, 1.204, 2.303 -> distances 0.387, 0.306,
    # 1.405: order (1, 0, 2), cumulative 0.3, 0.9, 1.0.
    row = np.log(f32([[0.6, 0.3, 0.1]]))
    keep_two = TypicalP(0.5)(NO_TOKENS, row.copy())  # one below 0.5, then the one reaching it
    np.testing.assert_array_equal(keep_two, f32([[row[0, 0], row[0, 1], L]]))
    keep_one = TypicalP(0.2)(NO_TOKENS, row.copy())
    np.testing.assert_array_equal(keep_one, f32([[L, row[0, 1], L]]))  # the argmax is gone


def test_min_new_tokens_counts_from_the_prompt_end():
    op = MinNewTokens(2, [0])
    op.start(3)
    logits = f32([[5, 1], [5, 1]])
    np.testing.assert_array_equal(op(np.zeros((2, 4), np.int32), logits.copy()), [[L, 1]] * 2)
    np.testing.assert_array_equal(op(np.zeros((2, 5), np.int32), logits.copy()), logits)


def test_bad_words_single_and_sequences_per_row():
    op = BadWords([[4], [1, 2, 3]])
    tokens = np.array([[9, 1, 2], [1, 2, 9]], np.int32)
    out = op(tokens, np.zeros((2, 6), np.float32))
    np.testing.assert_array_equal(out, f32([[0, 0, 0, L, L, 0], [0, 0, 0, 0, L, 0]]))


def test_terminals():
    logits = f32([[1, 3, 3], [L, L, 0]])
    assert Argmax()(logits, np.random.default_rng(0)).tolist() == [1, 2]
    assert Sample()(logits, np.random.default_rng(0))[1] == 2  # masked entries never drawn


# --- order --------------------------------------------------------------------------------


def _probs(logits):
    w = np.exp(logits.astype(np.float64) - logits.max(axis=1, keepdims=True))
    return w / w.sum(axis=1, keepdims=True)


def test_order_follows_the_math():
    row = np.log(f32([[0.5, 0.3, 0.2]]))
    # temperature and top_k commute on the distribution (top_k is invariant to positive scaling).
    a = chain(("temperature", {"temperature": 0.5}), ("top_k", {"k": 2}), ("sample", {}))
    b = chain(("top_k", {"k": 2}), ("temperature", {"temperature": 0.5}), ("sample", {}))
    la, lb = row.copy(), row.copy()
    for op in a.ops:
        la = op(NO_TOKENS, la)
    for op in b.ops:
        lb = op(NO_TOKENS, lb)
    np.testing.assert_allclose(_probs(la), [[25 / 34, 9 / 34, 0]], rtol=1e-6)
    np.testing.assert_allclose(_probs(lb), [[25 / 34, 9 / 34, 0]], rtol=1e-6)
    # temperature and top_p do not: at T=0.5 the probabilities are (25, 9, 4)/38, so top_p 0.6
    # keeps one token; before it, (0.5, 0.3) reach 0.6 and two survive with 25:9.
    c = chain(("temperature", {"temperature": 0.5}), ("top_p", {"p": 0.6}), ("sample", {}))
    d = chain(("top_p", {"p": 0.6}), ("temperature", {"temperature": 0.5}), ("sample", {}))
    lc, ld = row.copy(), row.copy()
    for op in c.ops:
        lc = op(NO_TOKENS, lc)
    for op in d.ops:
        ld = op(NO_TOKENS, ld)
    np.testing.assert_allclose(_probs(lc), [[1, 0, 0]], atol=1e-12)
    np.testing.assert_allclose(_probs(ld), [[25 / 34, 9 / 34, 0]], rtol=1e-6)


def test_argmax_skips_trailing_ops_that_keep_the_argmax():
    d = chain(
        ("repetition_penalty", {"penalty": 1.3}),
        ("temperature", {"temperature": 0.7}),
        ("top_k", {"k": 5}),
        ("argmax", {}),
    )
    assert [type(o).__name__ for o in d.ops] == ["RepetitionPenalty"]
    assert "skipped before argmax" in d.describe()[-1]
    kept = chain(("typical_p", {"p": 0.5}), ("argmax", {}))  # may change the argmax: kept
    assert [type(o).__name__ for o in kept.ops] == ["TypicalP"]


def test_default_mapping_is_the_reference_order():
    d = make_picker(
        GenerationSpec(repetition_penalty=1.2, min_length=3, do_sample=True, top_k=5),
        eos_token_ids=[0],
        vocab_size=10,
    )
    assert d.reference_order
    assert [type(o).__name__ for o in d.ops] == ["MinLength", "RepetitionPenalty"]
    assert isinstance(d.terminal, ReferenceSample)
    greedy = make_picker(GenerationSpec(), eos_token_ids=[0], vocab_size=10)
    assert isinstance(greedy.terminal, ReferenceGreedy) and not greedy.ops


def test_implicit_terminal_and_describe():
    d = chain(("top_k", {"k": 3}), do_sample=True)
    assert d.describe() == ["top_k(3)", "sample (implicit)"]


# --- validation -------------------------------------------------------------------------


def _paths(error):
    return [p.path for p in error.value.problems]


def test_unknown_op_lists_every_valid_op():
    with pytest.raises(ConfigError) as info:
        chain(("tempreature", {"temperature": 0.5}))
    assert _paths(info) == ["generation.logits[0].op"]
    for name in VALID_OPS:
        assert name in info.value.problems[0].message
    assert set(OPS) | {"grammar", "sample", "argmax"} == set(VALID_OPS)


@pytest.mark.parametrize(
    ("entry", "path"),
    [
        (("temperature", {"temperature": 0.0}), "generation.logits[0].temperature"),
        (("temperature", {"temperature": -1}), "generation.logits[0].temperature"),
        (("top_k", {"k": 0}), "generation.logits[0].k"),
        (("top_p", {"p": 1.5}), "generation.logits[0].p"),
        (("top_p", {"p": 0.0}), "generation.logits[0].p"),
        (("min_p", {"p": -0.1}), "generation.logits[0].p"),
        (("typical_p", {"p": math.nan}), "generation.logits[0].p"),
        (("bad_words", {"sequences": [[]]}), "generation.logits[0].sequences[0]"),
        (("min_new_tokens", {"min_new_tokens": -1}), "generation.logits[0].min_new_tokens"),
        (("top_k", {"k": 3, "kk": 1}), "generation.logits[0].kk"),
        (("sample", {"seed": 1}), "generation.logits[0].seed"),
        (("grammar", {"json_schema": {}, "regex": "a"}), "generation.logits[0]"),
        (("grammar", {"ebnf": "x"}), "generation.logits[0].ebnf"),
    ],
)
def test_out_of_range_is_reported_at_its_path(entry, path):
    with pytest.raises(ConfigError) as info:
        chain(entry)
    assert _paths(info) == [path]


def test_contradictions_are_reported_together():
    with pytest.raises(ConfigError) as info:
        chain(
            ("argmax", {}),
            ("temperature", {"temperature": 0.5}),
            repetition_penalty=1.1,
            do_sample=True,
        )
    assert _paths(info) == [
        "generation.repetition_penalty",
        "generation.logits[1]",
        "generation.do_sample",
    ]
    assert "after the terminal 'argmax'" in info.value.problems[1].message
    with pytest.raises(ConfigError) as info:
        check_chain(
            GenerationSpec(
                logits=(ProcessorSpec("grammar", {"regex": "a"}), ProcessorSpec("grammar"))
            )
        )
    assert _paths(info) == ["generation.logits[1]"]


def test_grammar_op_without_a_grammar(tmp_path):
    spec = GenerationSpec(logits=(ProcessorSpec("grammar"), ProcessorSpec("argmax")))
    with pytest.raises(ConfigError) as info:
        make_picker(spec, eos_token_ids=[0], vocab_size=10, tokenizer_json=tmp_path / "t.json")
    assert _paths(info) == ["generation.logits[0]"]
    assert "set_guidance" in info.value.problems[0].message


def test_unknown_guidance_type():
    with pytest.raises(GenerationError, match="ebnf"):
        make_picker(GenerationSpec(), eos_token_ids=[0], vocab_size=10, guidance=("ebnf", "x"))


# --- sampled frequencies (seeded, chi-square) -----------------------------------------------

DRAWS = 20_000
BASE = f32([[2.0, 1.5, 1.0, 0.6, 0.2, -0.3, -1.0, -2.0]])


def _softmax(x):
    w = np.exp(np.asarray(x, np.float64) - np.max(x))
    return w / w.sum()


def _typical_target(logits, p):
    probs = _softmax(logits)
    surprisal = -np.log(probs)
    entropy = float((probs * surprisal).sum())
    order = sorted(range(probs.size), key=lambda i: (abs(surprisal[i] - entropy), i))
    kept, mass = [], 0.0
    for i in order:
        kept.append(i)
        mass += probs[i]
        if mass >= p:
            break
    target = np.zeros_like(probs)
    target[kept] = probs[kept]
    return target / target.sum()


def _targets():
    p = _softmax(BASE[0])
    t07 = _softmax(BASE[0] / 0.7)
    top3 = np.where(np.arange(8) < 3, p, 0)
    order = np.argsort(-p, kind="stable")
    cum = np.cumsum(p[order])
    nucleus = order[: int(np.searchsorted(cum, 0.8)) + 1]
    top_p = np.where(np.isin(np.arange(8), nucleus), p, 0)
    min_p = np.where(p >= 0.2 * p.max(), p, 0)
    return {
        "temperature": ([("temperature", {"temperature": 0.7})], t07),
        "top_k": ([("top_k", {"k": 3})], top3 / top3.sum()),
        "top_p": ([("top_p", {"p": 0.8})], top_p / top_p.sum()),
        "min_p": ([("min_p", {"p": 0.2})], min_p / min_p.sum()),
        "typical_p": ([("typical_p", {"p": 0.6})], _typical_target(BASE[0], 0.6)),
    }


def _draw(entries, seed):
    d = chain(*entries, ("sample", {}))
    logits = np.repeat(BASE, DRAWS, axis=0)  # rows are independent: one call, 20k draws
    tokens = d.pick(np.zeros((DRAWS, 0), np.int32), logits, np.random.default_rng(seed))
    return np.bincount(tokens, minlength=8)


@pytest.mark.parametrize("name", list(_targets()))
def test_sampled_frequencies_match_the_target(name):
    entries, target = _targets()[name]
    counts = _draw(entries, seed=1234)
    support = target > 0
    assert counts[~support].sum() == 0  # nothing outside the kept set, ever
    assert chisquare(counts[support], target[support] * DRAWS).pvalue > 1e-3


def test_negative_control_detects_a_wrong_distribution():
    counts = _draw([("temperature", {"temperature": 1.0})], seed=1234)
    wrong = _softmax(BASE[0] / 0.7)
    assert chisquare(counts, wrong * DRAWS).pvalue < 1e-6


def test_same_seed_same_tokens():
    a = _draw([("top_k", {"k": 4})], seed=5)
    b = _draw([("top_k", {"k": 4})], seed=5)
    np.testing.assert_array_equal(a, b)
