"""The speculative strategy, checked: one ``SpeculativeSpec`` from either config form (v2
``pipeline.roles`` + ``strategy``, or v1 ``model.draft`` + ``speculative``, translated to the
former). No graph is read here; ``loading`` checks the spec against the models.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..checks import is_integer, is_number
from ..decoding.token_tree import TokenTree
from ..errors import ConfigError
from ..spec import PipelineSpec, StrategySpec, frozen_map

MAX_SPECULATIVE_TOKENS = 16  # the schema's bound; a verify pass feeds K + 1 tokens
ACCEPTANCE = ("greedy", "rejection_sampling")
# Greedy decisions a batched verify pass makes with a top-2 logit margin below this are redone
# by a one-token pass (kernels may round differently for one row and for several). Off by
# default: fp32 kernels agree to ~1e-4, and int4 MatMulNBits' int8-activation kernels differ by
# up to ~1 logit, which then also differs in the cached keys/values a redo cannot fix.
DEFAULT_VERIFY_MARGIN = 0.0
_WHERE = "pipeline.strategy"
DEFAULT_MIN_NGRAM = 2


@dataclass(frozen=True)
class SpeculativeSpec:
    """A speculative strategy checked against the model it runs on."""

    producer: str  # a key of PRODUCERS
    num_speculative_tokens: int
    acceptance: str  # auto | greedy | rejection_sampling
    adaptive: bool
    min_k: int
    params: Mapping[str, Any]
    draft_session: str | None
    tree: Mapping[str, Any] | None
    tree_note: str | None
    token_tree: TokenTree | None = None  # set when the target verifies the tree itself


@dataclass(frozen=True)
class Producer:
    """What a proposer kind takes from the config: its own parameters, whether it runs a draft
    session, and how its parameters' defaults resolve."""

    params: frozenset[str] = frozenset()
    needs_session: bool = True
    resolve: Callable[[dict[str, Any]], dict[str, Any]] = dict


def _ngram_params(params: dict[str, Any]) -> dict[str, Any]:
    hi = params.get("ngram_size", 3)
    # One-token matches are mostly wrong: on SmolLM2 int4, 14% of their drafts were kept,
    # against 32% for two tokens and 56% for four (benchmarks/speculative.py prompts).
    lo = params.get("min_ngram_size", min(DEFAULT_MIN_NGRAM, hi) if is_integer(hi) else 1)
    for key, value in (("ngram_size", hi), ("min_ngram_size", lo)):
        if not is_integer(value) or not 1 <= value <= 16:
            raise ConfigError.at(f"{_WHERE}.draft.{key}", f"expected 1..16, got {value!r}")
    if lo > hi:
        raise ConfigError.at(
            f"{_WHERE}.draft.min_ngram_size", f"{lo} is larger than ngram_size {hi}"
        )
    return {**params, "ngram_size": hi, "min_ngram_size": lo}


# The proposer kinds a config may name (``strategy.draft.producer``); ``proposers.PROPOSERS``
# builds each one.
PRODUCERS: dict[str, Producer] = {
    "draft_model": Producer(),
    "ngram": Producer(
        frozenset({"ngram_size", "min_ngram_size", "ngram_chained_lookup"}),
        needs_session=False,
        resolve=_ngram_params,
    ),
    "hidden_state": Producer(frozenset({"hidden_output"})),
}
_ALIASES = {"eagle": "hidden_state"}
_COMMON_PARAMS = frozenset({"adaptive", "min_adaptive_k", "cooldown", "verify_margin"})


def speculative_spec(spec: PipelineSpec) -> SpeculativeSpec:
    """Check the strategy's fields (ranges, producer, parameters); no graph is read here."""
    s: StrategySpec = spec.strategy
    name = s.producer or "draft_model"
    name = _ALIASES.get(name, name)
    producer = PRODUCERS.get(name)
    if producer is None:
        valid = ", ".join(sorted({*PRODUCERS, *_ALIASES}))
        raise ConfigError.at(f"{_WHERE}.draft.producer", f"unknown producer {name!r} ({valid})")
    k = s.num_speculative_tokens
    if not is_integer(k) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise ConfigError.at(
            f"{_WHERE}.num_speculative_tokens",
            f"expected an integer in [1, {MAX_SPECULATIVE_TOKENS}], got {k!r}",
        )
    if s.acceptance not in ("auto", *ACCEPTANCE):
        raise ConfigError.at(
            f"{_WHERE}.acceptance",
            f"{s.acceptance!r} is not implemented (expected one of: auto, {', '.join(ACCEPTANCE)})",
        )
    params = dict(s.params)
    tree = params.pop("tree", None)
    allowed = _COMMON_PARAMS | producer.params
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ConfigError.at(
            f"{_WHERE}.draft.{unknown[0]}",
            f"not a parameter of the {name} proposer (expected: {', '.join(sorted(allowed))})",
        )
    min_k = params.get("min_adaptive_k", 1)
    if not is_integer(min_k) or not 0 <= min_k <= k:
        raise ConfigError.at(f"{_WHERE}.draft.min_adaptive_k", f"expected 0..{k}, got {min_k!r}")
    margin = params.get("verify_margin", DEFAULT_VERIFY_MARGIN)
    if not is_number(margin) or not margin >= 0:
        raise ConfigError.at(
            f"{_WHERE}.draft.verify_margin", f"expected a number >= 0, got {margin!r}"
        )
    adaptive = bool(params.get("adaptive", True)) and min_k > 0  # v1: 0 = not adaptive
    draft_session = None
    if producer.needs_session:
        draft_session = s.draft_session or spec.roles.get("draft")
        if not draft_session:
            raise ConfigError.at(
                f"{_WHERE}.draft.session",
                f"the {name} proposer needs a draft session (or roles.draft)",
            )
        if draft_session not in spec.sessions:
            raise ConfigError.at(
                f"{_WHERE}.draft.session",
                f"no session {draft_session!r} (sessions: {', '.join(spec.sessions)})",
            )
    return SpeculativeSpec(
        producer=name,
        num_speculative_tokens=k,
        acceptance=s.acceptance,
        adaptive=adaptive,
        min_k=max(min_k, 1),
        params=frozen_map(producer.resolve(params)),
        draft_session=draft_session,
        tree=frozen_map(tree) if tree else None,
        tree_note=None,
    )
