"""The 0.18 Engine API's pure parts: turn-policy resolution (the reference's rules), option
setters, and stop-string matching."""

from __future__ import annotations

import pytest

from genai_runtime.batching.options import (
    EngineError,
    EngineTypeError,
    RequestHandle,
    TurnOptions,
    resolve_turn,
)
from genai_runtime.batching.stops import (
    StopMatcher,
    StopStringError,
    check_stop_strings,
    pending_stop_prefix,
)
from genai_runtime.spec import GenerationSpec

VOCAB = 100
GREEDY = GenerationSpec()  # the reference's defaults: do_sample false, top_k 50, temperature 1


def options(**values) -> TurnOptions:
    turn = TurnOptions(RequestHandle())
    for name, value in values.items():
        getattr(turn, f"set_{name}")(value)
    return turn


def test_unset_options_take_the_model_defaults() -> None:
    search = GenerationSpec(do_sample=True, top_k=7, top_p=0.5, temperature=0.3)
    policy = resolve_turn(None, search, VOCAB)
    g = policy.generation
    assert (g.do_sample, g.top_k, g.top_p, g.temperature) == (True, 7, 0.5, 0.3)
    assert (policy.max_generated_tokens, policy.seed, policy.stop_strings) == (0, None, ())


@pytest.mark.parametrize(
    "values",
    [
        {"top_k": 1},
        {"temperature": 0.0},
        {"do_sample": False, "top_k": 1},
        {"do_sample": False, "top_p": 1.0, "top_k": 0},
        {"do_sample": False, "temperature": 1.0},
        {"do_sample": True, "top_k": 1, "temperature": 0.0},
    ],
)
def test_values_that_agree_with_greedy_are_accepted(values) -> None:
    assert resolve_turn(options(**values), GREEDY, VOCAB).generation.is_greedy


def test_sampling_values_contradicting_greedy_are_named() -> None:
    with pytest.raises(EngineError, match="contradict it: temperature, top_k"):
        resolve_turn(options(do_sample=False, temperature=0.7, top_k=40), GREEDY, VOCAB)


@pytest.mark.parametrize(
    ("field", "named"), [("top_k", "search.top_k = 1"), ("temperature", "search.temperature = 0")]
)
def test_do_sample_under_a_greedy_model_default_names_the_default(field, named) -> None:
    search = GenerationSpec(**{field: 1 if field == "top_k" else 0.0})
    with pytest.raises(EngineError, match=named):
        resolve_turn(options(do_sample=True), search, VOCAB)
    # overriding that field on the turn is what asks to sample
    fixed = options(do_sample=True, top_k=4, temperature=0.8)
    assert not resolve_turn(fixed, search, VOCAB).generation.is_greedy


def test_sampled_turn_limits() -> None:
    with pytest.raises(EngineError, match="positive top_k or a positive top_p"):
        resolve_turn(options(do_sample=True, top_k=0, top_p=0.0), GREEDY, VOCAB)
    with pytest.raises(
        EngineError, match=r"top_k \(101\) must be less than or equal to vocab_size \(100\)"
    ):
        resolve_turn(options(do_sample=True, top_k=101), GREEDY, VOCAB)
    for bad, match in (
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size"),
    ):
        with pytest.raises(EngineError, match=match):
            resolve_turn(options(do_sample=True, **bad), GREEDY, VOCAB)


def test_setters_check_types_and_reset_unsets_everything() -> None:
    turn = TurnOptions(RequestHandle())
    for setter, value in (
        ("set_max_generated_tokens", -1),
        ("set_seed", 1 << 64),
        ("set_top_k", 1.5),
        ("set_do_sample", 1),
        ("set_temperature", "hot"),
    ):
        with pytest.raises(EngineTypeError):
            getattr(turn, setter)(value)
    with pytest.raises(EngineError, match="Unsupported guidance type: bogus"):
        turn.set_guidance("bogus", "x")
    with pytest.raises(EngineTypeError, match="expects a Request"):
        TurnOptions("not a request")
    turn.set_seed(0)  # zero is a seed, not "unset"
    turn.set_stop_strings(["a"])
    turn.set_guidance("regex", "a+")
    assert resolve_turn(turn, GREEDY, VOCAB).seed == 0
    turn.reset()
    policy = resolve_turn(turn, GREEDY, VOCAB)
    assert (policy.seed, policy.stop_strings, policy.guidance) == (None, (), None)


def test_stop_string_lists_are_checked() -> None:
    assert check_stop_strings([]) == ()
    with pytest.raises(StopStringError, match="index 1 is empty"):
        check_stop_strings(["a", ""])
    with pytest.raises(StopStringError, match="Too many stop strings: 17, the maximum is 16"):
        check_stop_strings(["a"] * 17)
    with pytest.raises(ValueError, match="embedded NUL"):
        check_stop_strings(["a\0b"])
    with pytest.raises(StopStringError, match="maximum is 16384"):
        check_stop_strings(["x" * 9000, "y" * 9000])
    with pytest.raises(StopStringError, match="list of str"):
        check_stop_strings("STOP")


def test_the_match_that_ends_first_wins_then_the_longest_then_the_lowest_index() -> None:
    # "cd" ends before "bcde" and before "e"; fed one character at a time across pieces
    matcher = StopMatcher(["bcde", "e", "cd"])
    assert [matcher.feed(c) for c in "abc"] == [None, None, None]
    assert matcher.feed("d") == (2, 2)
    # same end: the one starting first (longest) wins; same span: the lowest index
    assert StopMatcher(["de", "cde"]).feed("abcdef") == (1, 2)
    assert StopMatcher(["x", "x"]).feed("--x") == (0, 2)


def test_matching_spans_pieces_and_keeps_a_bounded_tail() -> None:
    matcher = StopMatcher(["STOP"])
    for piece in ["aaaa" * 50, "ST", "", "O"]:
        assert matcher.feed(piece) is None
    assert len(matcher._tail) <= 3  # only the longest stop's length - 1 is kept
    assert matcher.feed("P!") == (0, 200)
    assert pending_stop_prefix("say ST", ["STOP", "S"]) == 2
    assert pending_stop_prefix("nothing", ["STOP"]) == 0
