"""Speculative decoding: proposers draft tokens, the target verifies them all in one pass.

One ``SpeculativeSpec`` comes from either config form (v2 ``pipeline.roles`` + ``strategy``, or
v1 ``model.draft`` + ``speculative``, translated to the former). A round:

1. a proposer drafts up to K tokens after the sequence (``propose(context, k)``);
2. the target runs its unrun tokens plus the K drafts in one forward pass, which gives the
   next-token logits after every prefix;
3. ``accept`` (one pure function) keeps the longest acceptable prefix and picks one more token
   from the target, so a round always yields at least one token;
4. the target's cache rewinds to the accepted length, the proposer hears how many were kept
   (``observe(num_accepted)``) and rewinds its own state.

Greedy acceptance reproduces plain greedy decoding token for token (up to the rounding of a
batched pass). Rejection sampling keeps the target's sampling distribution exactly: accept a
draft x with probability min(1, p(x)/q(x)), else resample from norm(max(0, p - q)); n-gram drafts
are point masses (q = 1 at x).

The ``Generator`` API is unchanged: a round's tokens are buffered and handed out one per
``generate_next_token``; any other call first drops what was not handed out (``sync``).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from ..config.spec import FlowStep, KVCacheSpec, PipelineSpec, StrategySpec, frozen_map
from ..errors import (
    ConfigError,
    ConfigProblem,
    GenaiRuntimeError,
    ModelError,
    UnsupportedError,
)
from ..kv import CACHE_KINDS, plan_cache
from ..runtime.executor import Executor, TreePass, tree_obstacle
from ..runtime.plan import Plan, build_plan
from ..runtime.sessions import load_sessions
from ..session.graph_io import SessionIO
from .sampling import draw, sampling_distribution
from .token_tree import TokenTree, parse_tree, walk_tree

if TYPE_CHECKING:
    from ..generator import Generator
    from ..model import Model

MAX_SPECULATIVE_TOKENS = 16  # the schema's bound; a verify pass feeds K + 1 tokens
ACCEPTANCE = ("greedy", "rejection_sampling")
# Greedy decisions a batched verify pass makes with a top-2 logit margin below this are redone
# by a one-token pass (kernels may round differently for one row and for several). Off by
# default: fp32 kernels agree to ~1e-4, and int4 MatMulNBits' int8-activation kernels differ by
# up to ~1 logit, which then also differs in the cached keys/values a redo cannot fix.
DEFAULT_VERIFY_MARGIN = 0.0
_WHERE = "pipeline.strategy"
DEFAULT_MIN_NGRAM = 2


def _problem(path: str, message: str) -> ConfigError:
    return ConfigError([ConfigProblem(path, message)])


# --- acceptance -----------------------------------------------------------------------------


def accept(
    draft: np.ndarray,
    draft_probs: np.ndarray | None,
    target: np.ndarray,
    rng: np.random.Generator | None,
) -> tuple[int, int]:
    """How many of ``draft`` [k] to keep, and the token that follows them.

    ``target`` [k + 1, V] holds the target's next-token scores after each draft prefix. With
    ``rng`` None it is greedy: the longest prefix equal to the target's argmax, then the argmax
    at the first mismatch (or after the last draft). Otherwise ``target`` holds probabilities
    and ``draft_probs`` [k, V] the distributions the drafts were sampled from (None: point
    masses); rejection sampling then returns a token distributed exactly as the target's.
    """
    k = int(draft.shape[0])
    if target.shape[0] != k + 1:
        raise ValueError(f"target has {target.shape[0]} rows for {k} drafts (expected {k + 1})")
    if rng is None:
        choice = np.argmax(target, axis=-1)
        miss = np.flatnonzero(choice[:k] != draft)
        n = int(miss[0]) if miss.size else k
        return n, int(choice[n])
    for i in range(k):
        x = int(draft[i])
        p = target[i]
        q_x = 1.0 if draft_probs is None else float(draft_probs[i, x])
        if q_x > 0.0 and rng.random() * q_x < p[x]:  # u < p/q without dividing
            continue
        residual = p.copy()
        if draft_probs is None:
            residual[x] = 0.0
        else:
            np.subtract(residual, draft_probs[i], out=residual)
            np.maximum(residual, 0.0, out=residual)
        total = residual.sum()
        if total <= 0.0:  # p == q up to rounding: p itself is the residual's limit
            residual, total = p, p.sum()
        return i, _draw_dense(residual / total, rng)
    return k, _draw_dense(target[k], rng)


def _draw_dense(probs: np.ndarray, rng: np.random.Generator) -> int:
    ids = np.flatnonzero(probs)
    return draw(ids, probs[ids], rng)


# --- the spec -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpeculativeSpec:
    """A speculative strategy checked against the model it runs on."""

    producer: str  # a key of PROPOSERS
    num_speculative_tokens: int
    acceptance: str  # auto | greedy | rejection_sampling
    adaptive: bool
    min_k: int
    params: Mapping[str, Any]
    draft_session: str | None
    tree: Mapping[str, Any] | None
    tree_note: str | None
    token_tree: TokenTree | None = None  # set when the target verifies the tree itself


_COMMON_PARAMS = {"adaptive", "min_adaptive_k", "cooldown", "verify_margin"}
_PRODUCER_PARAMS = {
    "draft_model": set(),
    "ngram": {"ngram_size", "min_ngram_size", "ngram_chained_lookup"},
    "hidden_state": {"hidden_output"},
}
_ALIASES = {"eagle": "hidden_state"}


def speculative_spec(spec: PipelineSpec) -> SpeculativeSpec:
    """Check the strategy's fields (ranges, producer, parameters); no graph is read here."""
    s: StrategySpec = spec.strategy
    producer = s.producer or "draft_model"
    producer = _ALIASES.get(producer, producer)
    if producer not in _PRODUCER_PARAMS:
        valid = ", ".join(sorted({*_PRODUCER_PARAMS, *_ALIASES}))
        raise _problem(f"{_WHERE}.draft.producer", f"unknown producer {producer!r} ({valid})")
    k = s.num_speculative_tokens
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise _problem(
            f"{_WHERE}.num_speculative_tokens",
            f"expected an integer in [1, {MAX_SPECULATIVE_TOKENS}], got {k!r}",
        )
    if s.acceptance not in ("auto", *ACCEPTANCE):
        raise _problem(
            f"{_WHERE}.acceptance",
            f"{s.acceptance!r} is not implemented (expected one of: auto, {', '.join(ACCEPTANCE)})",
        )
    params = dict(s.params)
    tree = params.pop("tree", None)
    allowed = _COMMON_PARAMS | _PRODUCER_PARAMS[producer]
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise _problem(
            f"{_WHERE}.draft.{unknown[0]}",
            f"not a parameter of the {producer} proposer (expected: {', '.join(sorted(allowed))})",
        )
    min_k = params.get("min_adaptive_k", 1)
    if isinstance(min_k, bool) or not isinstance(min_k, int) or not 0 <= min_k <= k:
        raise _problem(f"{_WHERE}.draft.min_adaptive_k", f"expected 0..{k}, got {min_k!r}")
    margin = params.get("verify_margin", DEFAULT_VERIFY_MARGIN)
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not margin >= 0:
        raise _problem(f"{_WHERE}.draft.verify_margin", f"expected a number >= 0, got {margin!r}")
    adaptive = bool(params.get("adaptive", True)) and min_k > 0  # v1: 0 = not adaptive
    draft_session = s.draft_session or spec.roles.get("draft")
    if producer != "ngram":
        if not draft_session:
            raise _problem(
                f"{_WHERE}.draft.session",
                f"the {producer} proposer needs a draft session (or roles.draft)",
            )
        if draft_session not in spec.sessions:
            raise _problem(
                f"{_WHERE}.draft.session",
                f"no session {draft_session!r} (sessions: {', '.join(spec.sessions)})",
            )
    else:
        draft_session = None
    if producer == "ngram":
        hi = params.get("ngram_size", 3)
        # One-token matches are mostly wrong: on SmolLM2 int4, 14% of their drafts were kept,
        # against 32% for two tokens and 56% for four (benchmarks/speculative.py prompts).
        lo = params.get("min_ngram_size", min(DEFAULT_MIN_NGRAM, hi))
        for key, value in (("ngram_size", hi), ("min_ngram_size", lo)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 16:
                raise _problem(f"{_WHERE}.draft.{key}", f"expected 1..16, got {value!r}")
        if lo > hi:
            raise _problem(f"{_WHERE}.draft.min_ngram_size", f"{lo} is larger than ngram_size {hi}")
        params = {**params, "ngram_size": hi, "min_ngram_size": lo}
    return SpeculativeSpec(
        producer=producer,
        num_speculative_tokens=k,
        acceptance=s.acceptance,
        adaptive=adaptive,
        min_k=max(min_k, 1),
        params=frozen_map(params),
        draft_session=draft_session,
        tree=frozen_map(tree) if tree else None,
        tree_note=None,
    )


# --- adaptive K -----------------------------------------------------------------------------


_FIRST_WAIT, _LONGEST_WAIT = 4, 64  # plain rounds before a bucket that drafts nothing probes


class AdaptiveK:
    """Draft length from the recent acceptance rate and what a wider target pass costs.

    Keeps, per proposal bucket (n-gram: the matched n; other proposers: one bucket), an
    exponential average ``a`` of accepted / proposed, and one of ``r``, the extra time of each
    token a verify pass feeds beyond the first as a fraction of a one-token pass (fed by
    ``timed``; 0.5 until measured). Treating acceptance as geometric, K drafts yield
    ``1 + a + ... + a**K`` tokens for ``1 + r*K`` of a plain step's time; ``choose`` returns the
    K that maximises that within [min_k, max_k], or 0 when no K beats a plain step. Such a
    bucket still drafts ``min_k`` as a probe after 4 plain rounds, so the rate can recover; each
    probe that keeps nothing doubles that wait (up to 64). On a CPU where a wide pass costs
    almost as much per token as a narrow one, unlikely drafts are pure loss.
    """

    def __init__(self, max_k: int, min_k: int = 1, adaptive: bool = True, decay: float = 0.7):
        self.max_k, self.min_k, self.adaptive, self.decay = max_k, min_k, adaptive, decay
        self.extra = 0.5  # r: cost of each extra token in a pass / cost of a one-token pass
        self._step: float | None = None  # seconds of a one-token pass (EMA)
        self._rate: dict[int, float] = {}
        self._k: dict[int, int] = {}
        self._skipped: dict[int, int] = {}  # plain rounds since the last probe
        self._wait: dict[int, int] = {}  # plain rounds between probes

    @property
    def k(self) -> int:
        """The current K of the default bucket."""
        return self._k.get(0, self.max_k)

    def rate(self, bucket: int = 0) -> float:
        return self._rate.get(bucket, 0.75)

    def timed(self, width: int, seconds: float) -> None:
        """A target pass over ``width`` tokens took ``seconds``."""
        if width == 1:
            self._step = seconds if self._step is None else 0.8 * self._step + 0.2 * seconds
        elif self._step:
            extra = max((seconds - self._step) / (width - 1) / self._step, 0.0)
            self.extra = 0.8 * self.extra + 0.2 * extra

    def choose(self, bucket: int = 0) -> int:
        """Drafts to verify for a proposal of ``bucket`` (0: draft nothing this round)."""
        k = self._k.get(bucket, self.max_k)
        if k:
            return k
        skipped = self._skipped.get(bucket, 0) + 1
        if skipped < self._wait.get(bucket, _FIRST_WAIT):
            self._skipped[bucket] = skipped
            return 0
        self._skipped[bucket] = 0
        return max(self.min_k, 1)

    def update(self, accepted: int, proposed: int, bucket: int = 0) -> None:
        if not self.adaptive or proposed == 0:
            return
        if self._k.get(bucket) == 0:  # a probe
            wait = self._wait.get(bucket, _FIRST_WAIT)
            self._wait[bucket] = _FIRST_WAIT if accepted else min(2 * wait, _LONGEST_WAIT)
        rate = self._rate[bucket] = (
            self.decay * self.rate(bucket) + (1 - self.decay) * accepted / proposed
        )
        best, best_gain, tokens, term = 0, 1.0, 1.0, 1.0
        for k in range(1, self.max_k + 1):
            term *= rate
            tokens += term
            gain = tokens / (1.0 + self.extra * k)
            if gain > best_gain:
                best, best_gain = k, gain
        self._k[bucket] = max(self.min_k, min(self.max_k, best)) if best else 0


# --- proposers ------------------------------------------------------------------------------


@dataclass
class Proposal:
    tokens: np.ndarray  # int32 [k]
    probs: np.ndarray | None = None  # [k, V] draft distributions; None: point masses
    bucket: int = 0  # how sure the proposer is (n-gram: the matched n); AdaptiveK keys on it
    # token trees: ranked candidates per depth along ``tokens`` (None: ``tokens`` alone)
    candidates: list[np.ndarray] | None = None


def _ranked(row: np.ndarray, width: int) -> np.ndarray:
    """The ``width`` highest-scoring ids of ``row``, best first."""
    if width <= 1:
        return np.array([int(np.argmax(row))], np.int32)
    top = np.argpartition(-row, width - 1)[:width]
    return top[np.argsort(-row[top], kind="stable")].astype(np.int32)


_EMPTY = np.zeros(0, np.int32)


class NgramProposer:
    """Prompt lookup: find the latest earlier occurrence of the sequence's last n tokens
    (n from ``ngram_size`` down to ``min_ngram_size``) and propose what followed it.

    An index of n-gram -> latest position after it is grown as the sequence grows, so a
    lookup costs O(n) per size instead of a scan of the whole context.
    """

    def __init__(self, max_n: int = 3, min_n: int = 1, chained: bool = False):
        self.max_n, self.min_n, self.chained = max_n, min_n, chained
        self._index: list[dict[bytes, int]] = [{} for _ in range(max_n + 1)]
        self._indexed = 0  # continuation starts < this are indexed
        self._seen: np.ndarray | None = None

    def _grow(self, context: np.ndarray) -> None:
        length = context.shape[0]
        seen = self._seen
        start = self._indexed
        # A rewind or a new prompt that changed indexed tokens: start over.
        changed = seen is not None and not np.array_equal(seen[:start], context[:start])
        if start > length or changed:
            self._index = [{} for _ in range(self.max_n + 1)]
            start = 0
        data = context.astype(np.int32, copy=False)
        for i in range(max(start, 1), length):  # continuation starts at i (i < length)
            for n in range(self.min_n, min(self.max_n, i) + 1):
                self._index[n][data[i - n : i].tobytes()] = i
        self._indexed = max(length, 1) if length else 0
        self._seen = data.copy()

    def _lookup(self, context: np.ndarray, length: int, k: int) -> tuple[np.ndarray, int]:
        """The continuation of the longest match, and its n (0: none)."""
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            i = self._index[n].get(context[length - n : length].tobytes())
            if i is not None and i < length:
                return context[i : min(i + k, length)], n
        return _EMPTY, 0

    def propose(self, context: np.ndarray, k: int, widths: list[int] | None = None) -> Proposal:
        """One continuation; a token tree gets it as its rank-0 branch (``widths`` unused)."""
        context = np.ascontiguousarray(context, np.int32)
        self._grow(context)
        found, matched = self._lookup(context, context.shape[0], k)
        if self.chained and 0 < found.size < k:
            # Extend by looking up again from the context with the drafts appended.
            parts, ext = [found], np.concatenate([context, found])
            while sum(p.size for p in parts) < k:
                index_backup = self._index, self._indexed, self._seen
                self._grow(ext)
                more, _ = self._lookup(ext, ext.shape[0], k - sum(p.size for p in parts))
                self._index, self._indexed, self._seen = index_backup
                if not more.size:
                    break
                parts.append(more)
                ext = np.concatenate([ext, more])
            found = np.concatenate(parts)[:k]
        return Proposal(found.astype(np.int32), bucket=matched)

    def observe(self, num_accepted: int) -> None:
        """Stateless between rounds: the index follows the context it is given."""


def _draft_runtime(model: Model, session: str) -> tuple[PipelineSpec, Plan, dict]:
    """The draft decoder for session ``session``: the whole model in the folder that holds its
    file when that folder has its own genai_config.json (a separately exported draft model),
    else that one graph as a single-stage decoder with the target's KV naming."""
    from ..model import Model as ModelClass

    spec = model.spec
    model_dir = spec.model_dir or model.model_dir
    path = (model_dir / spec.sessions[session].file).resolve()
    folder = path.parent
    if folder != Path(model_dir).resolve() and (folder / "genai_config.json").is_file():
        # The draft runs between the target's passes: one thread pool for both.
        draft = ModelClass(folder, turns=True)
        return draft.spec, draft.plan, draft.sessions
    kv = spec.state.kv_cache
    kv = KVCacheSpec(
        kind=kv.kind, num_kv_heads=kv.num_kv_heads, head_size=kv.head_size, format=kv.format
    )
    draft_spec = dataclasses.replace(
        spec,
        sessions=frozen_map({session: spec.sessions[session]}),
        flow=(FlowStep(run=session),),
        dataflow=(),
        roles=frozen_map(),
        strategy=StrategySpec(),
        state=dataclasses.replace(spec.state, kv_cache=kv),
    )
    sessions, ios, errors = load_sessions(draft_spec, [session], turns=model.takes_turns)
    if errors:
        raise errors[0]
    return draft_spec, build_plan(draft_spec, ios), sessions


class DraftModelProposer:
    """A smaller decoder with its own sessions, executor and KV cache drafts autoregressively.

    It catches up on tokens it has not seen (the last round's bonus token, a prompt), drafts k
    tokens (argmax, or sampled from its own distribution for rejection sampling) and, told how
    many were kept, rewinds its cache to the kept prefix.
    """

    def __init__(
        self,
        spec: PipelineSpec,
        plan: Plan,
        sessions: Mapping[str, ort.InferenceSession],
        *,
        max_length: int,
        sampling: Mapping[str, Any] | None,
        rng: np.random.Generator | None,
    ):
        layout = plan.layout
        kv_plan = None
        if layout is not None:
            kv_plan = plan_cache(
                layout, spec.state.kv_cache, spec.generation.past_present_share_buffer
            )
        self.exec = Executor(
            plan, sessions, kv_plan, batch_size=1, max_length=max_length,
            pad_token_id=spec.tokens.pad,
        )  # fmt: skip
        self.max_length = max_length
        self.sampling = sampling
        self.rng = rng
        self.vocab = plan.vocab_size
        self._base = 0
        self._k = 0
        self._ids = np.zeros((1, 1), np.int32)
        self._fed = np.zeros(max_length, np.int32)  # the tokens its cache holds, by position

    def propose(self, context: np.ndarray, k: int, widths: list[int] | None = None) -> Proposal:
        """``widths``: rank that many candidates per depth along the argmax path (a token
        tree; its drafts are then deterministic point masses, also when sampling)."""
        length = context.shape[0]
        k = min(k, self.max_length - length)
        ex = self.exec
        if k <= 0:
            return Proposal(_EMPTY)
        held = min(ex.length, length)
        differ = np.flatnonzero(self._fed[:held] != context[:held])
        if differ.size or ex.length >= length:  # a rewound or edited sequence: drop the rest
            ex.rewind_to(min(int(differ[0]) if differ.size else held, length - 1))
        tokens = np.empty(k, np.int32)
        sampled = self.sampling is not None and widths is None
        probs = np.zeros((k, self.vocab), np.float64) if sampled else None
        candidates = [] if widths is not None else None
        logits = self._run(context[None, ex.length : length])
        for i in range(k):
            row = logits[0]
            if candidates is not None:
                candidates.append(_ranked(row, widths[i]))
                tokens[i] = candidates[-1][0]
            elif probs is None:
                tokens[i] = int(np.argmax(row))
            else:
                ids, p = sampling_distribution(row, **self.sampling)
                probs[i, ids] = p
                tokens[i] = draw(ids, p, self.rng)
            if i + 1 < k:
                self._ids[0, 0] = tokens[i]
                logits = self._run(self._ids)
        self._base, self._k = length, k
        return Proposal(tokens, probs, candidates=candidates)

    def _run(self, tokens: np.ndarray) -> np.ndarray:
        start = self.exec.length
        self._fed[start : start + tokens.shape[1]] = tokens[0]
        try:
            return self.exec.forward(tokens)
        except Exception as exc:
            self.exec.rewind_to(start)
            if isinstance(exc, GenaiRuntimeError):
                raise
            raise ModelError(f"draft model run failed: {exc}") from exc

    def observe(self, num_accepted: int) -> None:
        # Drafts 1..k-1 were fed to the draft model; the kept ones stay in its cache.
        self.exec.rewind_to(self._base + min(num_accepted, self._k - 1))

    def reset(self) -> None:
        self.exec.rewind_to(0)


class HiddenStateProposer:
    """EAGLE/MTP-style head fed by a wire from the target's hidden states.

    Its graph takes the last token's id and the target's hidden state at that position (the
    wired input) and returns next-token logits, plus optionally its own hidden state of the
    same shape (``hidden_output``, or the one output shaped like the wired input) that is fed
    back to draft further. Without one it drafts a single token per round.
    """

    def __init__(
        self,
        session: ort.InferenceSession,
        io: SessionIO,
        *,
        wire_input: str,
        source: tuple[str, str],
        hidden_output: str | None,
        vocab: int,
    ):
        self.session = session
        self.io = io
        self.wire_input = wire_input
        self.source = source  # (flow stage, output tensor) on the target
        ids = [n for n, info in io.inputs.items() if n != wire_input]
        if len(ids) != 1 or not np.issubdtype(io.inputs[ids[0]].dtype, np.integer):
            raise ModelError(
                f"{io.file}: a hidden-state proposer takes the wired input {wire_input!r} and one "
                f"integer token-id input; graph inputs: {', '.join(io.inputs)}"
            )
        self.ids_input = ids[0]
        self.ids_dtype = io.inputs[ids[0]].dtype
        wired = io.inputs[wire_input]
        logits = [n for n, o in io.outputs.items() if o.static_dim(o.rank - 1) == vocab]
        if hidden_output is None:
            same = [n for n, o in io.outputs.items() if o.rank == wired.rank and n not in logits]
            hidden_output = same[0] if len(same) == 1 else None
        elif hidden_output not in io.outputs:
            raise ModelError(
                f"{io.file}: no output {hidden_output!r} (draft.hidden_output); "
                f"outputs: {', '.join(io.outputs)}"
            )
        if len(logits) != 1:
            raise ModelError(
                f"{io.file}: expected one output whose last dimension is the vocabulary "
                f"({vocab}); outputs: {', '.join(str(o) for o in io.outputs.values())}"
            )
        self.logits_output = logits[0]
        self.hidden_output = hidden_output
        self.hidden: np.ndarray | None = None  # [1, 1, H] for the last token, set by the driver

    def propose(self, context: np.ndarray, k: int, widths: list[int] | None = None) -> Proposal:
        if self.hidden is None or k <= 0:
            return Proposal(_EMPTY)
        if self.hidden_output is None:
            k = 1
        outputs = [self.logits_output] + ([self.hidden_output] if self.hidden_output else [])
        hidden = self.hidden
        token = int(context[-1])
        tokens = np.empty(k, np.int32)
        candidates = [] if widths is not None else None
        for i in range(k):
            feeds = {
                self.ids_input: np.array([[token]], self.ids_dtype),
                self.wire_input: hidden,
            }
            result = self.session.run(outputs, feeds)
            row = result[0].reshape(-1, result[0].shape[-1])[-1]
            token = int(np.argmax(row))
            tokens[i] = token
            if candidates is not None:
                candidates.append(_ranked(row, widths[i]))
            if self.hidden_output:
                hidden = result[1][:, -1:]
        return Proposal(tokens, candidates=candidates)

    def observe(self, num_accepted: int) -> None:
        """The driver sets ``hidden`` from the target's verify pass."""


# --- trees ----------------------------------------------------------------------------------


def best_linear_branch(choices: Any) -> list[int]:
    """The path of top-1 choices ([0], [0, 0], ...) as deep as ``medusa_choices`` lists it."""
    paths = {tuple(c) for c in choices or () if isinstance(c, list | tuple)}
    branch: list[int] = []
    while (*branch, 0) in paths:
        branch.append(0)
    return branch


def _tree_plan(
    spec: PipelineSpec, tree: Mapping[str, Any], plan: Plan, k: int
) -> tuple[TokenTree | None, int, str]:
    """The tree the target verifies (None: its best linear branch instead), K, and what
    ``explain`` says about it."""
    where = f"{_WHERE}.tree.medusa_choices"
    choices = tree.get("medusa_choices")
    parsed = parse_tree(choices, where, k)
    kind = plan_cache(plan.layout, spec.state.kv_cache, spec.generation.past_present_share_buffer)
    can_compact = hasattr(CACHE_KINDS.get(kind.kind), "compact") and not plan.layout.drivers
    why = tree_obstacle(plan, can_compact)
    if why is None:
        note = (
            f"token tree ({len(parsed.paths)} nodes, depth {parsed.depth}, widths "
            f"{parsed.widths()}) verified in one pass with a tree attention mask"
        )
        return parsed, parsed.depth, note
    branch = best_linear_branch(choices)
    depth = max(1, min(k, len(branch)))
    note = (
        f"token tree ({len(choices)} medusa_choices) verified as its best linear branch "
        f"{branch or [0]} (K={depth}): {why}"
    )
    return None, depth, note


def tree_note(spec: PipelineSpec, plan: Plan) -> str | None:
    """What ``explain`` says about a strategy's token tree, from the target's graphs alone."""
    tree = spec.strategy.params.get("tree") if spec.strategy.kind == "speculative" else None
    if not tree:
        return None
    try:
        return _tree_plan(spec, tree, plan, spec.strategy.num_speculative_tokens)[2]
    except ConfigError as exc:
        return str(exc)


# --- loading --------------------------------------------------------------------------------


@dataclass
class SpeculativeModel:
    """What a Model holds for speculative decoding: the checked spec and the draft's sessions."""

    spec: SpeculativeSpec
    draft: tuple[PipelineSpec, Plan, dict] | None = None
    hidden: tuple[ort.InferenceSession, SessionIO, str, tuple[str, str]] | None = None

    def describe(self) -> list[str]:
        s = self.spec
        lines = [
            f"proposer {s.producer}"
            + (f" (session {s.draft_session!r})" if s.draft_session else "")
            + f", up to {s.num_speculative_tokens} tokens per round"
            + (f", adaptive K >= {s.min_k}" if s.adaptive else ", fixed K"),
            f"acceptance {s.acceptance} (auto: greedy match for greedy search, "
            "rejection sampling otherwise)",
        ]
        if self.draft is not None:
            dspec = self.draft[0]
            lines.append(f"draft model: {dspec.model_dir} ({len(self.draft[1].stages)} stage(s))")
        if self.hidden is not None:
            _, io, wire_input, (src, tensor) = self.hidden
            lines.append(f"hidden state: {src}.{tensor} -> {io.file}:{wire_input}")
        if s.tree_note:
            lines.append(s.tree_note)
        return lines


def load_speculative(model: Model, *, trust: bool = False) -> SpeculativeModel | None:
    """Check a speculative strategy against the model's graphs and load the draft's sessions.

    Every error here is raised at load time, before any generator exists.
    """
    spec = model.spec
    if spec.strategy.kind != "speculative":
        return None
    sspec = speculative_spec(spec)
    plan = model.plan
    _check_target(spec, plan)
    if sspec.tree:
        tree, depth, note = _tree_plan(spec, sspec.tree, plan, sspec.num_speculative_tokens)
        sspec = dataclasses.replace(
            sspec, num_speculative_tokens=depth, tree_note=note, token_tree=tree
        )
    out = SpeculativeModel(sspec)
    if sspec.producer == "draft_model":
        draft = _draft_runtime(model, sspec.draft_session)
        dplan = draft[1]
        if dplan.vocab_size != plan.vocab_size:
            raise ModelError(
                f"draft {_files(dplan)} has vocabulary size {dplan.vocab_size} but target "
                f"{_files(plan)} has {plan.vocab_size}: they must share one vocabulary"
            )
        if dplan.layout is not None:
            _check_rewind(draft[0], "draft ")
        out.draft = draft
    elif sspec.producer == "hidden_state":
        out.hidden = _hidden_runtime(model, sspec.draft_session, trust)
    return out


def _files(plan: Plan) -> str:
    return ", ".join(stage.io.file for stage in plan.stages)


def _check_target(spec: PipelineSpec, plan: Plan) -> None:
    if plan.layout is None:
        raise ModelError(
            f"{_files(plan)}: the target declares no KV cache; speculative decoding rewinds it"
        )
    _check_rewind(spec, "")
    if plan.layout.new_rows:
        raise ModelError(
            f"{_files(plan)}: the target runs fixed chunks of {plan.layout.new_rows} tokens "
            "(a fixed-shape cache), so a verification pass cannot score every drafted token"
        )
    logits = next(s.logits for s in plan.stages if s.logits is not None)
    if logits.rank != 3:
        raise ModelError(
            f"target logits {logits} give the last position only; verification scores every "
            "drafted token and needs [batch, seq, vocab] logits"
        )
    verify = spec.strategy.verify_session or spec.roles.get("target")
    if not verify:
        return
    if verify not in spec.sessions:
        raise _problem(f"{_WHERE}.verify.session", f"no session {verify!r}")
    model_dir = spec.model_dir or Path(".")
    files = {(model_dir / s.session.file).resolve() for s in plan.stages}
    if (model_dir / spec.sessions[verify].file).resolve() not in files:
        raise _problem(
            f"{_WHERE}.verify.session",
            f"session {verify!r} ({spec.sessions[verify].file}) is not a stage of the flow "
            "that decodes; the target is the flow's own decoder",
        )


def _check_rewind(spec: PipelineSpec, who: str) -> None:
    kv = spec.state.kv_cache
    if kv.sliding_window is not None and kv.sliding_window.slide_key_value_cache:
        raise _problem(
            "pipeline.state.kv_cache.sliding_window",
            f"the {who}cache slides (evicts old tokens) and cannot rewind rejected drafts; "
            "speculative decoding needs a cache that rewinds",
        )
    kind = kv.kind
    cls = CACHE_KINDS.get(kind)
    if cls is not None and not getattr(cls, "can_rewind", True):
        raise _problem(
            "pipeline.state.kv_cache.kind",
            f"the {who}cache kind {kind!r} cannot rewind; speculative decoding needs one that "
            f"can ({', '.join(k for k, c in CACHE_KINDS.items() if getattr(c, 'can_rewind', 1))})",
        )


def _hidden_runtime(model: Model, session: str, trust: bool):
    spec = model.spec
    wires = [w for w in spec.dataflow if w.dst == session]
    if len(wires) != 1:
        raise _problem(
            "pipeline.dataflow",
            f"the hidden_state proposer {session!r} needs exactly one wire into it from the "
            f"target's hidden states (found {len(wires)})",
        )
    wire = wires[0]
    stages = {s.name: s for s in model.plan.stages}
    src = wire.src
    if src not in stages:  # a role alias naming the same graph file as a flow stage
        model_dir = spec.model_dir or Path(".")
        target = (model_dir / spec.sessions[src].file).resolve() if src in spec.sessions else None
        src = next(
            (n for n, s in stages.items() if (model_dir / s.session.file).resolve() == target),
            None,
        )
    if src is None or wire.src_tensor not in stages[src].io.outputs:
        raise ModelError(f"{wire}: no stage of the target's flow outputs {wire.src_tensor!r}")
    sessions, ios, errors = load_sessions(spec, [session], trust=trust, turns=model.takes_turns)
    if errors:
        raise errors[0]
    io = ios[session]
    if wire.dst_tensor not in io.inputs:
        raise ModelError(
            f"{wire}: {io.file} has no input {wire.dst_tensor!r}; inputs: {', '.join(io.inputs)}"
        )
    return sessions[session], io, wire.dst_tensor, (src, wire.src_tensor)


# --- the driver -----------------------------------------------------------------------------


class BufferedDriver:
    """Hands out tokens produced several at a time, one per ``generate_next_token``.

    ``round()`` writes its tokens into the generator's sequence past its length and returns
    them; the target's executor may have run further than what was handed out. ``sync`` drops
    what was not handed out and restores the generator's invariant (every token before the
    pending ones has run).
    """

    def __init__(self, gen: Generator):
        if gen.batch_size != 1:
            raise UnsupportedError(
                f"{type(self).__name__} decodes one sequence at a time; batch_size is "
                f"{gen.batch_size}"
            )
        self.gen = gen
        self.exec: Executor = gen._exec
        self._buffer: deque[int] = deque()

    def round(self) -> list[int]:
        raise NotImplementedError

    def generate_next_token(self) -> None:
        gen = self.gen  # a finished generator pads before it gets here
        if not self._buffer:
            self._buffer.extend(self.round())
        token = self._buffer.popleft()
        gen._next[0] = token
        gen._logits = None
        gen._pending = None
        if gen._is_eos[token]:
            # As the plain loop (and the reference): the EOS is reported, not appended.
            gen._eos_seen[0] = True
            gen._any_eos = True
            gen._done = True
            self.sync()
            self.exec.finish()
            return
        gen._length += 1
        gen._done = gen._length >= gen.max_length
        if not self._buffer:
            self.sync()
        if gen._done:
            self.exec.finish()

    def sync(self) -> None:
        gen = self.gen
        self._buffer.clear()
        length, ran = gen._length, self.exec.length
        if ran >= length and not (gen._logits is not None and ran == length):
            ran = max(length - 1, 0)
            self.exec.rewind_to(ran)
            gen._logits = None
            self.on_rewind(ran)
        gen._pending = gen._seq[:, ran:length].copy() if ran < length else None

    def on_rewind(self, length: int) -> None:
        """The target's cache went back to ``length`` tokens outside a round."""

    def forward(self, tokens: np.ndarray, tree: TreePass | None = None) -> np.ndarray:
        """Run ``tokens`` [n] on the target; logits [n, V] after each (a reused buffer)."""
        start = self.exec.length
        try:
            self.exec.forward(tokens[None, :], tree)
        except Exception as exc:
            self.exec.rewind_to(start)
            if isinstance(exc, GenaiRuntimeError):
                raise
            raise ModelError(f"model run failed: {exc}") from exc
        return self.exec.pass_logits()[0]


class SpeculativeDriver(BufferedDriver):
    def __init__(self, gen: Generator, model: SpeculativeModel):
        super().__init__(gen)
        s = model.spec
        search = gen.search
        acceptance = s.acceptance
        if acceptance == "auto":
            acceptance = "greedy" if search.is_greedy else "rejection_sampling"
        if acceptance == "greedy" and not search.is_greedy:
            raise ConfigError(
                [ConfigProblem(f"{_WHERE}.acceptance",
                               "greedy acceptance needs greedy search (do_sample false, top_k 1 "
                               "or temperature 0); use rejection_sampling to sample")]
            )  # fmt: skip
        self.sampling: dict[str, Any] | None = None
        if not search.is_greedy:
            self.sampling = {
                "top_k": search.top_k,
                "top_p": search.top_p,
                "temperature": search.temperature,
                "min_p": search.min_p,
            }
        self.spec = s
        self.vocab = gen.vocab_size
        self.k = AdaptiveK(s.num_speculative_tokens, min(s.min_k, s.num_speculative_tokens),
                           s.adaptive)  # fmt: skip
        self.cooldown = bool(s.params.get("cooldown", False))
        self._misses = 0
        self._rest = 0
        self.hidden_source: tuple[str, str] | None = None
        self.lookup = s.producer == "ngram"
        if s.producer == "ngram":
            self.proposer: Any = NgramProposer(
                s.params["ngram_size"],  # both sizes resolved by speculative_spec
                s.params["min_ngram_size"],
                bool(s.params.get("ngram_chained_lookup", False)),
            )
        elif s.producer == "draft_model":
            dspec, dplan, dsessions = model.draft
            self.proposer = DraftModelProposer(
                dspec, dplan, dsessions, max_length=gen.max_length,
                sampling=self.sampling, rng=gen._rng,
            )  # fmt: skip
        else:
            session, io, wire_input, source = model.hidden
            self.proposer = HiddenStateProposer(
                session, io, wire_input=wire_input, source=source,
                hidden_output=s.params.get("hidden_output"), vocab=self.vocab,
            )  # fmt: skip
            self.hidden_source = source
        self.proposed = 0
        self.accepted = 0
        self.margin = float(s.params.get("verify_margin", DEFAULT_VERIFY_MARGIN))
        self.guarded = 0  # near-ties re-decided by a one-token pass
        self.tree = s.token_tree
        if self.tree is not None and not self.exec.takes_tree:
            raise UnsupportedError("this generator's target cannot verify a token tree")
        self.side_accepts = 0  # kept tree nodes off the rank-0 branch
        self.rounds = 0  # target passes
        self.drafted_rounds = 0  # passes that verified at least one draft
        self.emitted = 0

    def stats(self) -> dict[str, float]:
        return {
            "proposed": self.proposed,
            "accepted": self.accepted,
            "acceptance_rate": self.accepted / self.proposed if self.proposed else 0.0,
            "rounds": self.rounds,
            "tokens": self.emitted,
            "mean_accepted_length": (
                self.accepted / self.drafted_rounds if self.drafted_rounds else 0.0
            ),
            "tokens_per_round": self.emitted / self.rounds if self.rounds else 0.0,
            "k": self.k.k,
            "near_ties_rechecked": self.guarded,
            "tree_side_accepts": self.side_accepts,
        }

    def _process(self, prefix_end: int, row: np.ndarray) -> np.ndarray:
        """The chain's logits ops (penalties) on one row; the terminal is applied by accept()."""
        gen = self.gen
        ops = gen._decoder.ops
        if not ops:
            return row
        out = row[None, :].copy()
        tokens = gen._seq[:, :prefix_end]
        for op in ops:
            out = op(tokens, out)
        return out[0]

    def round(self) -> list[int]:
        gen = self.gen
        length = gen._length
        ran = self.exec.length
        if ran > length:
            self.sync()
            ran = self.exec.length
        if self.tree is not None:
            return self._tree_round(length, ran)
        room = gen.max_length - length - 1
        # A lookup is free: propose first, then size K by how sure the match is. A draft model
        # costs a run per token: size K first.
        budget = min(self.k.max_k if self.lookup else self.k.choose(), room)
        if self._rest > 0:
            self._rest -= 1
            budget = 0
        proposal = (
            self.proposer.propose(gen._seq[0, :length], budget) if budget > 0 else Proposal(_EMPTY)
        )
        if self.lookup and proposal.tokens.size:
            budget = min(budget, self.k.choose(proposal.bucket))
        drafts = proposal.tokens[:budget]
        k = int(drafts.shape[0])
        pending = gen._seq[0, ran:length]
        feed = np.concatenate([pending, drafts]) if k else pending
        head = gen._logits
        if feed.size:
            started = time.perf_counter()
            logits = self.forward(feed)
            self.k.timed(int(feed.size), time.perf_counter() - started)
            # Row i scores the token after feed[i]; drafts are scored from the last pending row.
            first = pending.shape[0] if head is not None else pending.shape[0] - 1
            rows = logits[first:]
        else:
            rows = np.zeros((0, self.vocab), np.float32)
        if head is not None:
            rows = np.concatenate([head.reshape(1, -1), rows])
        gen._seq[0, length : length + k] = drafts
        target = np.empty((k + 1, self.vocab), np.float32 if self.sampling is None else np.float64)
        for i in range(k + 1):
            row = self._process(length + i, rows[i])
            if self.sampling is None:
                target[i] = row
            else:
                target[i] = 0.0
                ids, p = sampling_distribution(row, **self.sampling)
                target[i, ids] = p
        if self.sampling is None:
            n, token = accept(drafts, None, target, None)
        else:
            n, token = accept(drafts, proposal.probs, target, gen._rng)
        hidden_row = pending.shape[0] + n - 1 if feed.size else -1
        tie = self._near_tie(target, n, exact_first=head is not None) if feed.size > 1 else None
        if tie is not None:
            # A near-tie decided by a batched pass: batched kernels may round differently from
            # the one-token pass plain decoding uses, so redo that decision one token at a time.
            n = tie
            self.exec.rewind_to(length + n - 1)
            row = self.forward(gen._seq[0, length + n - 1 : length + n])[0]
            token = int(np.argmax(self._process(length + n, row)))
            self.guarded += 1
            hidden_row = 0
        if self.hidden_source is not None:
            # The pass fed pending + drafts: the last kept token is row len(pending) + n - 1.
            self._take_hidden(hidden_row)
        self.exec.rewind_to(length + n)
        self.proposer.observe(n)
        out = [int(t) for t in drafts[:n]] + [token]
        gen._seq[0, length : length + n + 1] = out
        self.rounds += 1
        if k:
            self.proposed += k
            self.accepted += n
            self.drafted_rounds += 1
            self.k.update(n, k, proposal.bucket)
            self._cool(n)
        self.emitted += len(out)
        gen._logits = None
        return out

    def _tree_round(self, length: int, ran: int) -> list[int]:
        """One pass over the pending tokens plus every node of the token tree, each node seeing
        only its ancestors; ``walk_tree`` keeps one path and the cache keeps just that path."""
        gen, tree = self.gen, self.tree
        depth = min(tree.depth, gen.max_length - length - 1)
        candidates: list[np.ndarray] = []
        if depth > 0:
            proposal = self.proposer.propose(gen._seq[0, :length], depth, tree.widths()[:depth])
            candidates = proposal.candidates or [t[None] for t in proposal.tokens[:depth]]
        pending = gen._seq[0, ran:length]
        p = pending.shape[0]
        nodes, tokens = tree.nodes(candidates[:depth])
        room = gen.max_length - ran - p  # the pass must fit: parents come first, so cut the tail
        nodes, tokens = nodes[:room], tokens[:room]
        offsets, visible, parents = tree.layout(nodes)
        head = gen._logits
        rows = np.zeros((0, self.vocab), np.float32)
        if p or nodes.size:
            full = np.zeros((p + nodes.size, p + nodes.size), bool)
            full[:p, :p] = np.tri(p, dtype=bool)
            full[p:, :p] = True
            full[p:, p:] = visible
            layout = TreePass(np.concatenate([np.arange(p), p - 1 + offsets]), full)
            rows = self.forward(np.concatenate([pending, tokens]), layout)

        def score(node: int) -> np.ndarray:
            path = []
            r = node
            while r >= 0:
                path.append(int(tokens[r]))
                r = int(parents[r])
            gen._seq[0, length : length + len(path)] = path[::-1]
            if node >= 0:
                raw = rows[p + node]
            elif p:
                raw = rows[p - 1]  # after the last pending token: the root's prediction
            else:
                raw = head.reshape(-1)  # the generator's own pass already scored the root
            row = self._process(length + len(path), raw)
            if self.sampling is None:
                return row
            out = np.zeros(self.vocab, np.float64)
            ids, probs = sampling_distribution(row, **self.sampling)
            out[ids] = probs
            return out

        path, token = walk_tree(parents, tokens, score, None if self.sampling is None else gen._rng)
        if self.hidden_source is not None:
            self._take_hidden(p + path[-1] if path else p - 1)
        self.exec.keep(length, np.asarray(path, np.int64))
        self.proposer.observe(len(path))
        out = [int(tokens[r]) for r in path] + [token]
        gen._seq[0, length : length + len(out)] = out
        self.rounds += 1
        if nodes.size:
            self.proposed += int(nodes.size)
            self.accepted += len(path)
            self.drafted_rounds += 1
            self.side_accepts += sum(1 for r in path if tree.paths[nodes[r]][-1] > 0)
        self.emitted += len(out)
        gen._logits = None
        return out

    def _near_tie(self, target: np.ndarray, n: int, exact_first: bool) -> int | None:
        """The first greedy decision (rows 0..n) whose top-2 logit margin is below
        ``verify_margin``; row 0 is exact when it came from the generator's own pass."""
        if self.sampling is not None or self.margin <= 0.0:
            return None
        for i in range(1 if exact_first else 0, n + 1):
            top2 = np.partition(target[i], -2)[-2:]
            if abs(float(top2[1] - top2[0])) < self.margin:
                return i
        return None

    def _cool(self, n: int) -> None:
        if not self.cooldown:
            return
        self._misses = self._misses + 1 if n == 0 else 0
        if self._misses >= 3:  # three empty rounds in a row: plain steps for a while
            self._misses, self._rest = 0, 4

    def _take_hidden(self, row: int) -> None:
        """The target's hidden state at the last kept position feeds the proposer."""
        tensor = self.hidden_source[1]
        if row < 0:
            self.proposer.hidden = None
            return
        hidden = self.exec.output(tensor)
        self.proposer.hidden = np.ascontiguousarray(hidden[:, row : row + 1])

    def on_rewind(self, length: int) -> None:
        if isinstance(self.proposer, HiddenStateProposer):
            self.proposer.hidden = None


def make_driver(gen: Generator, model: Model) -> BufferedDriver | None:
    """The driver a generator uses instead of one-token steps, or None for standard decoding."""
    controller = getattr(model, "controller", None)
    if controller is not None:
        from ..plugins import ControllerDriver

        return ControllerDriver(gen, controller)
    speculative = getattr(model, "speculative", None)
    if speculative is None:
        return None
    decoder = gen._decoder
    if decoder.grammar is not None or not decoder.reference_order:
        raise UnsupportedError(
            "speculative decoding verifies with the search options' chain; an explicit "
            "generation.logits chain or a grammar is not supported with it yet"
        )
    return SpeculativeDriver(gen, speculative)
