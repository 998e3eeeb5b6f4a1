"""Logits processors against slow pure-Python references, and against onnxruntime-genai itself.

The references below are written from the definitions (and the loops of the reference's
sampling_distribution.h / search.cpp), one token at a time, with float32 scalar arithmetic so
the comparison is bit-exact.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genai_runtime.decoding.processors import (
    LOWEST,
    PROCESSORS,
    FrequencyPenalty,
    LogitBias,
    MinLength,
    NoRepeatNgram,
    PresencePenalty,
    ProcessorChain,
    RepetitionPenalty,
    SuppressTokens,
    build_processor,
    make_chain,
)
from genai_runtime.errors import ConfigError
from genai_runtime.spec import GenerationSpec, ProcessorSpec

F32 = np.float32


# --- slow references -----------------------------------------------------------------------


def ref_min_length(tokens, logits, min_length, eos):
    out = logits.copy()
    if tokens.shape[1] < min_length:
        for row in out:
            for e in eos:
                if 0 <= e < len(row):
                    row[e] = LOWEST
    return out


def ref_repetition(tokens, logits, penalty):
    out = logits.copy()
    p = F32(penalty)
    with np.errstate(over="ignore"):
        for b, seq in enumerate(tokens.tolist()):
            seen = set()
            for t in seq:
                if 0 <= t < out.shape[1] and t not in seen:
                    seen.add(t)
                    s = out[b, t]
                    out[b, t] = s * p if s < 0 else s / p
    return out


def ref_no_repeat(tokens, logits, n):
    out = logits.copy()
    for b, seq in enumerate(tokens.tolist()):
        length = len(seq)
        if n <= 0 or length < n:
            continue
        target = seq[length - (n - 1) :] if n > 1 else []
        for start in range(length - n + 1):
            if seq[start : start + n - 1] == target:
                banned = seq[start + n - 1]
                if 0 <= banned < out.shape[1]:
                    out[b, banned] = LOWEST
    return out


def ref_presence(tokens, logits, penalty):
    out = logits.copy()
    for b, seq in enumerate(tokens.tolist()):
        for t in set(seq):
            if 0 <= t < out.shape[1]:
                out[b, t] = out[b, t] - F32(penalty)
    return out


def ref_frequency(tokens, logits, penalty):
    out = logits.copy()
    for b, seq in enumerate(tokens.tolist()):
        for t, c in Counter(seq).items():
            if 0 <= t < out.shape[1]:
                out[b, t] = out[b, t] - F32(c) * F32(penalty)
    return out


def ref_bias(tokens, logits, bias):
    out = logits.copy()
    for t, v in bias.items():
        if 0 <= int(t) < out.shape[1]:
            out[:, int(t)] += F32(v)
    return out


def ref_suppress(tokens, logits, ids):
    out = logits.copy()
    for t in ids:
        if 0 <= t < out.shape[1]:
            out[:, t] = LOWEST
    return out


def random_case(rng, *, batch=3, vocab=40, length=None, alphabet=12):
    """Tokens from a small alphabet (so repeats happen) plus out-of-range ids; mixed-sign logits."""
    length = int(rng.integers(0, 25)) if length is None else length
    tokens = rng.integers(0, alphabet, size=(batch, length)).astype(np.int32)
    if length:
        # Sprinkle ids outside [0, V): they must be ignored.
        mask = rng.random(tokens.shape) < 0.1
        tokens[mask] = rng.choice([-3, -1, vocab, vocab + 7], size=int(mask.sum()))
    logits = (rng.standard_normal((batch, vocab)) * 3).astype(np.float32)
    return tokens, logits


def assert_same(got, expected):
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)


# --- each processor against its reference ----------------------------------------------------


@pytest.mark.parametrize("seed", range(30))
def test_processors_match_slow_references(seed):
    rng = np.random.default_rng(seed)
    tokens, logits = random_case(rng)
    vocab = logits.shape[1]
    penalty = float(rng.choice([0.5, 0.9, 1.3, 2.0]))
    cases = [
        (RepetitionPenalty(penalty), ref_repetition(tokens, logits, penalty)),
        (PresencePenalty(0.7), ref_presence(tokens, logits, 0.7)),
        (PresencePenalty(-0.4), ref_presence(tokens, logits, -0.4)),
        (FrequencyPenalty(0.3), ref_frequency(tokens, logits, 0.3)),
        (SuppressTokens([1, 3, -2, vocab, 3]), ref_suppress(tokens, logits, [1, 3, -2, vocab])),
    ]
    bias = {2: 1.5, "5": -2.0, -1: 3.0, vocab + 1: 1.0, 7: -np.inf}
    cases.append((LogitBias(bias), ref_bias(tokens, logits, bias)))
    for n in range(0, 5):
        cases.append((NoRepeatNgram(n), ref_no_repeat(tokens, logits, n)))
    for min_length in (0, tokens.shape[1], tokens.shape[1] + 1):
        eos = [0, 2, vocab + 3, -1]
        cases.append((MinLength(min_length, eos), ref_min_length(tokens, logits, min_length, eos)))
    for processor, expected in cases:
        buffer = logits.copy()
        got = processor(tokens, buffer)
        assert got is buffer, f"{processor!r} must work in place"
        assert_same(got, expected)


def test_repetition_penalty_signs_and_uniqueness():
    tokens = np.array([[1, 1, 1, 2], [3, 3, 0, 0], [9, 9, 9, 9]], dtype=np.int32)
    logits = np.zeros((3, 5), dtype=np.float32)
    logits[0, [1, 2]] = [4.0, -4.0]
    logits[1, [0, 3]] = [0.0, -1.0]
    logits[2, :] = 1.0
    got = RepetitionPenalty(2.0)(tokens, logits.copy())
    # Penalised once per distinct id: 4 -> 2 (not 0.5), -4 -> -8; 0 stays 0; id 9 >= V ignored.
    assert got[0, 1] == 2.0 and got[0, 2] == -8.0
    assert got[1, 0] == 0.0 and got[1, 3] == -2.0
    assert_same(got[2], np.ones(5, np.float32))


def test_repetition_penalty_on_masked_logit_overflows_like_float32():
    tokens = np.array([[0]], dtype=np.int32)
    logits = np.array([[LOWEST, 1.0]], dtype=np.float32)
    assert RepetitionPenalty(2.0)(tokens, logits)[0, 0] == -np.inf


def test_min_length_boundary_and_several_eos():
    logits = np.zeros((2, 6), dtype=np.float32)
    processor = MinLength(4, [1, 4, 99])
    masked = processor(np.zeros((2, 3), np.int32), logits.copy())
    assert (masked[:, [1, 4]] == LOWEST).all() and (masked[:, [0, 2, 3, 5]] == 0).all()
    # T == min_length: the token being predicted makes the sequence longer than min_length.
    assert_same(processor(np.zeros((2, 4), np.int32), logits.copy()), logits)


def test_no_repeat_ngram_edge_cases():
    logits = np.zeros((1, 10), dtype=np.float32)

    def banned(seq, n):
        out = NoRepeatNgram(n)(np.array([seq], np.int32), logits.copy())
        return sorted(np.flatnonzero(out[0] == LOWEST).tolist())

    assert banned([2, 2], 3) == []  # T < n: nothing to compare yet
    assert banned([2, 2, 2], 3) == [2]  # T == n: window at 0 matches the trailing (2, 2)
    assert banned([1, 2, 3, 1], 2) == [2]
    assert banned([1, 2, 3, 1], 3) == []  # (3, 1) never occurred before
    assert banned([3, 1, 2, 3, 1], 3) == [2]
    assert banned([1, 5, 2], 1) == [1, 2, 5]  # unigrams: everything seen is banned
    assert banned([4, 12, 4], 2) == []  # the follower 12 is outside the vocabulary
    assert banned([], 2) == []


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.lists(st.integers(-1, 6), min_size=0, max_size=14), min_size=1, max_size=3).map(
        lambda rows: [r + [0] * (max(map(len, rows)) - len(r)) for r in rows]
    ),
    st.integers(0, 5),
)
def test_no_repeat_ngram_property(rows, n):
    tokens = np.array(rows, dtype=np.int32).reshape(len(rows), -1)
    logits = np.arange(len(rows) * 6, dtype=np.float32).reshape(len(rows), 6)
    assert_same(NoRepeatNgram(n)(tokens, logits.copy()), ref_no_repeat(tokens, logits, n))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(-2, 9), min_size=0, max_size=20),
    st.lists(st.floats(-50, 50, width=32), min_size=8, max_size=8),
    st.sampled_from([0.25, 0.8, 1.0, 1.2, 3.0]),
)
def test_repetition_penalty_property(seq, scores, penalty):
    tokens = np.array([seq], dtype=np.int32).reshape(1, -1)
    logits = np.array([scores], dtype=np.float32)
    expected = ref_repetition(tokens, logits, penalty)
    assert_same(RepetitionPenalty(penalty)(tokens, logits.copy()), expected)


# --- registry, build-time validation, chain ------------------------------------------------


def test_registry_keys():
    assert set(PROCESSORS) == {
        "min_length",
        "repetition_penalty",
        "no_repeat_ngram",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "suppress_tokens",
        "min_new_tokens",
        "bad_words",
    }
    assert not {"temperature", "top_k", "top_p", "min_p"} & set(PROCESSORS)


def test_unknown_kind_lists_valid_kinds():
    with pytest.raises(ConfigError) as info:
        build_processor(ProcessorSpec("foo"), path="generation.logits[1]")
    (problem,) = info.value.problems
    assert problem.path == "generation.logits[1].op"
    assert "'foo'" in problem.message
    for kind in PROCESSORS:
        assert kind in problem.message


@pytest.mark.parametrize(
    ("kind", "params", "path"),
    [
        ("repetition_penalty", {"penalty": 0.0}, "penalty"),
        ("repetition_penalty", {"penalty": -1.0}, "penalty"),
        ("repetition_penalty", {"penalty": float("nan")}, "penalty"),
        ("repetition_penalty", {"penalty": "2"}, "penalty"),
        ("repetition_penalty", {"penalty": True}, "penalty"),
        ("repetition_penalty", {}, "penalty"),
        ("repetition_penalty", {"penalty": 1.2, "penalt": 1.0}, "penalt"),
        ("no_repeat_ngram", {"ngram_size": -1}, "ngram_size"),
        ("no_repeat_ngram", {"ngram_size": 2.5}, "ngram_size"),
        ("min_length", {"min_length": -3}, "min_length"),
        ("min_length", {"min_length": 3, "eos_token_ids": ["x"]}, "eos_token_ids[0]"),
        ("presence_penalty", {"penalty": float("inf")}, "penalty"),
        ("frequency_penalty", {"penalty": None}, "penalty"),
        ("logit_bias", {"bias": [1, 2]}, "bias"),
        ("logit_bias", {"bias": {"abc": 1.0}}, "bias['abc']"),
        ("logit_bias", {"bias": {"3": 1.0, 3: 2.0}}, "bias[3]"),
        ("logit_bias", {"bias": {3: float("inf")}}, "bias[3]"),
        ("logit_bias", {"bias": {3: float("nan")}}, "bias[3]"),
        ("suppress_tokens", {"ids": [1, 2.0]}, "ids[1]"),
        ("suppress_tokens", {"ids": {"a": 1}}, "ids"),
    ],
)
def test_bad_params_fail_at_build_time(kind, params, path):
    with pytest.raises(ConfigError) as info:
        build_processor(ProcessorSpec(kind, params), path="generation.logits[0]")
    assert [p.path for p in info.value.problems] == [f"generation.logits[0].{path}"]


def test_make_chain_none_when_inactive():
    assert make_chain(GenerationSpec(), eos_token_ids=[2], vocab_size=10) is None
    idle = GenerationSpec(min_length=5)  # no EOS ids to mask: nothing to do
    assert make_chain(idle, eos_token_ids=[], vocab_size=10) is None


def test_make_chain_is_the_reference_order_and_ignores_logits():
    spec = GenerationSpec(
        min_length=3,
        repetition_penalty=1.5,
        no_repeat_ngram_size=2,
        logits=(ProcessorSpec("logit_bias", {"bias": {"1": 2.0}}),),  # decoding.chain's job
    )
    chain = make_chain(spec, eos_token_ids=[0, 9], vocab_size=10)
    assert isinstance(chain, ProcessorChain)
    assert [type(p) for p in chain.processors] == [MinLength, RepetitionPenalty, NoRepeatNgram]

    rng = np.random.default_rng(7)
    tokens, logits = random_case(rng, vocab=10, length=5, alphabet=10)
    expected = logits.copy()
    expected = ref_min_length(tokens, expected, 3, [0, 9])
    expected = ref_repetition(tokens, expected, 1.5)
    expected = ref_no_repeat(tokens, expected, 2)
    assert_same(chain(tokens, logits.copy()), expected)


def test_make_chain_reports_every_problem_at_its_field():
    spec = GenerationSpec(repetition_penalty=0.0, no_repeat_ngram_size=-2)
    with pytest.raises(ConfigError) as info:
        make_chain(spec, eos_token_ids=[2], vocab_size=10)
    assert [p.path for p in info.value.problems] == [
        "generation.repetition_penalty",
        "generation.no_repeat_ngram_size",
    ]


# --- cross-check with onnxruntime-genai 0.18 ------------------------------------------------
# og.Generator.get_logits() after generate_next_token() returns the *next* step's raw model
# logits (it recomputes them), so the processed row is not observable. Instead: feed crafted
# logits with set_logits(), let the reference pick greedily, and compare with the argmax of
# our processed logits. The tiny GPT-2 has V=1000 and eos=pad=98.


@pytest.fixture(scope="module")
def og_pick(gpt2_dir):
    og = pytest.importorskip("onnxruntime_genai")
    model = og.Model(str(gpt2_dir))

    def pick(prompt, logits, **options):
        prompt = np.asarray(prompt, dtype=np.int32)
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=64, batch_size=prompt.shape[0], **options)
        generator = og.Generator(model, params)
        generator.append_tokens(prompt)
        generator.set_logits(np.asarray(logits, np.float32).reshape(prompt.shape[0], 1, -1))
        generator.generate_next_token()
        return np.asarray(generator.get_next_tokens()).tolist()

    return pick


def _crafted(entries, vocab=1000):
    row = np.full(vocab, -50.0, dtype=np.float32)
    for token, value in entries.items():
        row[token] = value
    return row[None, :]


@pytest.mark.parametrize(
    ("prompt", "scores", "options", "expected"),
    [
        ([5, 7], {5: 4.0, 6: 1.5}, {"repetition_penalty": 2.0}, 5),  # 4/2 = 2 > 1.5
        ([5, 7, 5, 5], {5: 4.0, 6: 1.5}, {"repetition_penalty": 2.0}, 5),  # once per distinct id
        ([5, 7], {5: 4.0, 6: 2.5}, {"repetition_penalty": 2.0}, 6),
        ([5, 7], {5: -1.0, 6: -1.5}, {"repetition_penalty": 2.0}, 6),  # negative: -1 * 2
        ([5, 7], {5: -1.0, 6: -0.6}, {"repetition_penalty": 0.5}, 5),  # penalty < 1 rewards
        ([5, 7, 9], {98: 5.0, 6: 1.0}, {"min_length": 4}, 6),  # T=3 < 4: EOS masked
        ([5, 7, 9, 9], {98: 5.0, 6: 1.0}, {"min_length": 4}, 98),  # T=4: allowed
        ([1, 2, 3, 1], {2: 5.0, 6: 1.0}, {"no_repeat_ngram_size": 2}, 6),
        ([1, 2, 3, 1], {2: 5.0, 6: 1.0}, {"no_repeat_ngram_size": 3}, 2),
        ([3, 1, 2, 3, 1], {2: 5.0, 6: 1.0}, {"no_repeat_ngram_size": 3}, 6),
        ([1, 2], {2: 5.0, 6: 1.0}, {"no_repeat_ngram_size": 1}, 6),
        ([2, 2], {2: 5.0, 6: 1.0}, {"no_repeat_ngram_size": 3}, 2),
        ([2, 2, 2], {2: 5.0, 6: 1.0}, {"no_repeat_ngram_size": 3}, 6),
    ],
)
def test_reference_runtime_agrees_on_crafted_cases(og_pick, prompt, scores, options, expected):
    logits = _crafted(scores)
    assert og_pick([prompt], logits, **options) == [expected]
    generation = GenerationSpec(
        min_length=options.get("min_length", 0),
        repetition_penalty=options.get("repetition_penalty", 1.0),
        no_repeat_ngram_size=options.get("no_repeat_ngram_size", 0),
    )
    chain = make_chain(generation, eos_token_ids=[98], vocab_size=1000)
    ours = chain(np.array([prompt], np.int32), logits.copy())
    assert int(np.argmax(ours[0])) == expected


def test_reference_runtime_agrees_on_random_batches(og_pick):
    rng = np.random.default_rng(2024)
    alphabet = np.array([3, 4, 5, 6, 7, 8, 98])
    for _ in range(40):
        length = int(rng.integers(1, 10))
        tokens = rng.choice(alphabet, size=(3, length)).astype(np.int32)
        logits = rng.standard_normal((3, 1000)).astype(np.float32)
        # Put the sequence's own tokens (and EOS) in contention so the penalties decide.
        logits[:, alphabet] += rng.uniform(1.5, 4.0, size=(3, alphabet.size)).astype(np.float32)
        logits[:, alphabet] *= rng.choice([-1, 1], size=(3, alphabet.size)).astype(np.float32)
        options = {
            "min_length": int(rng.integers(0, 12)),
            "repetition_penalty": float(rng.choice([1.0, 0.7, 1.3, 2.5])),
            "no_repeat_ngram_size": int(rng.integers(0, 4)),
        }
        chain = make_chain(GenerationSpec(**options), eos_token_ids=[98], vocab_size=1000) or (
            lambda t, x: x
        )
        ours = np.argmax(chain(tokens, logits.copy()), axis=1).tolist()
        assert og_pick(tokens, logits, **options) == ours, options
