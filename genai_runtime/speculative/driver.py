"""The speculative driver: each round a proposer drafts, the target verifies every draft in one
pass, ``accept`` keeps the longest acceptable prefix plus one token of the target's own.

A round:

1. the proposer drafts up to K tokens after the sequence (``propose(context, k)``);
2. the target runs its unrun tokens plus the K drafts in one forward pass, which gives the
   next-token logits after every prefix;
3. ``accept`` (one pure function) keeps the longest acceptable prefix and picks one more token
   from the target, so a round always yields at least one token;
4. the target's cache rewinds to the accepted length, the proposer hears how many were kept
   (``observe``) and sees the target's pass (``observe_target``).

Greedy acceptance reproduces plain greedy decoding token for token (up to the rounding of a
batched pass). Rejection sampling keeps the target's sampling distribution exactly: the rows the
target scored go through the same ``TokenPicker`` a plain step uses (``process`` for penalties,
``distribution`` for what its sampler draws from).
"""

from __future__ import annotations

import time

import numpy as np

from ..decoding.acceptance import accept
from ..decoding.token_tree import walk_tree
from ..errors import ConfigError, UnsupportedError
from ..runtime.driver import DecodeState, DriverSetup, forward_rows
from ..runtime.executor import TreePass
from .adaptive import AdaptiveK
from .proposers import Proposal, ProposerSource
from .proposers.base import EMPTY
from .spec import DEFAULT_VERIFY_MARGIN, SpeculativeSpec

_WHERE = "pipeline.strategy"


class SpeculativeDriver:
    def __init__(self, spec: SpeculativeSpec, source: ProposerSource, setup: DriverSetup):
        picker = setup.picker
        obstacle = picker.verify_obstacle()
        if obstacle is not None:
            raise UnsupportedError(obstacle)
        acceptance = spec.acceptance
        if acceptance == "auto":
            acceptance = "greedy" if picker.is_greedy else "rejection_sampling"
        if acceptance == "greedy" and not picker.is_greedy:
            raise ConfigError.at(
                f"{_WHERE}.acceptance",
                "greedy acceptance needs greedy search (do_sample false, top_k 1 or "
                "temperature 0); use rejection_sampling to sample",
            )
        self.sampled = not picker.is_greedy
        self.spec = spec
        self.vocab = setup.vocab_size
        self.k = AdaptiveK(spec.num_speculative_tokens,
                           min(spec.min_k, spec.num_speculative_tokens), spec.adaptive)  # fmt: skip
        self.cooldown = bool(spec.params.get("cooldown", False))
        self._misses = 0
        self._rest = 0
        self.tree = spec.token_tree
        if self.tree is not None and not setup.executor.takes_tree:
            raise UnsupportedError("this generator's target cannot verify a token tree")
        self.proposer = source.make(spec, setup)
        self.margin = float(spec.params.get("verify_margin", DEFAULT_VERIFY_MARGIN))
        self.proposed = 0
        self.accepted = 0
        self.guarded = 0  # near-ties re-decided by a one-token pass
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

    def on_rewind(self, length: int) -> None:
        self.proposer.on_rewind(length)

    def _process(self, state: DecodeState, prefix_end: int, row: np.ndarray) -> np.ndarray:
        """The picker's logits ops (penalties) on one row; its terminal is applied by accept()."""
        picker = state.picker
        if not picker.ops:
            return row
        return picker.process(state.tokens[None, :prefix_end], row[None, :].copy())[0]

    def _scores(self, state: DecodeState, prefix_end: int, row: np.ndarray) -> np.ndarray:
        """What ``accept`` compares for one target row: processed logits when greedy, else the
        picker's sampling distribution as a dense [V] vector."""
        row = self._process(state, prefix_end, row)
        if not self.sampled:
            return row
        out = np.zeros(self.vocab, np.float64)
        ids, probs = state.picker.distribution(row)
        out[ids] = probs
        return out

    def round(self, state: DecodeState) -> list[int]:
        if self.tree is not None:
            return self._tree_round(state)
        ex, seq, length = state.executor, state.tokens, state.length
        ran = ex.length
        room = state.max_length - length - 1
        # A free proposer (a lookup) proposes first, then K is sized by how sure the match
        # is; one that costs a run per token has K sized first.
        free = self.proposer.free
        budget = min(self.k.max_k if free else self.k.choose(), room)
        if self._rest > 0:
            self._rest -= 1
            budget = 0
        elif free and self.k.wants_plain_step() and ran == length - 1:
            # A lookup drafts in almost every round, so a one-token pass is timed on purpose
            # (else wide passes are priced by the prior alone).
            budget = 0
        proposal = self.proposer.propose(seq[:length], budget) if budget > 0 else Proposal(EMPTY)
        if free and proposal.tokens.size:
            budget = min(budget, self.k.choose(proposal.bucket))
        drafts = proposal.tokens[:budget]
        k = int(drafts.shape[0])
        pending = seq[ran:length]
        feed = np.concatenate([pending, drafts]) if k else pending
        head = state.logits
        if feed.size:
            started = time.perf_counter()
            logits = forward_rows(ex, feed)
            self.k.timed(int(feed.size), time.perf_counter() - started)
            # Row i scores the token after feed[i]; drafts are scored from the last pending row.
            first = pending.shape[0] if head is not None else pending.shape[0] - 1
            rows = logits[first:]
        else:
            rows = np.zeros((0, self.vocab), np.float32)
        if head is not None:
            rows = np.concatenate([head.reshape(1, -1), rows])
        seq[length : length + k] = drafts
        target = np.empty((k + 1, self.vocab), np.float64 if self.sampled else np.float32)
        for i in range(k + 1):
            target[i] = self._scores(state, length + i, rows[i])
        rng = state.rng if self.sampled else None
        n, token = accept(drafts, proposal.probs if self.sampled else None, target, rng)
        hidden_row = pending.shape[0] + n - 1 if feed.size else -1
        tie = self._near_tie(target, n, exact_first=head is not None) if feed.size > 1 else None
        if tie is not None:
            # A near-tie decided by a batched pass: batched kernels may round differently from
            # the one-token pass plain decoding uses, so redo that decision one token at a time.
            n = tie
            ex.rewind_to(length + n - 1)
            row = forward_rows(ex, seq[length + n - 1 : length + n])[0]
            token = int(np.argmax(self._process(state, length + n, row)))
            self.guarded += 1
            hidden_row = 0
        # The pass fed pending + drafts: the last kept token is row len(pending) + n - 1.
        self.proposer.observe_target(ex, hidden_row)
        ex.rewind_to(length + n)
        self.proposer.observe(n)
        out = [int(t) for t in drafts[:n]] + [token]
        seq[length : length + n + 1] = out
        self.rounds += 1
        if k:
            self.proposed += k
            self.accepted += n
            self.drafted_rounds += 1
            self.k.update(n, k, proposal.bucket)
            self._cool(n)
        self.emitted += len(out)
        return out

    def _tree_round(self, state: DecodeState) -> list[int]:
        """One pass over the pending tokens plus every node of the token tree, each node seeing
        only its ancestors; ``walk_tree`` keeps one path and the cache keeps just that path."""
        tree, ex, seq, length = self.tree, state.executor, state.tokens, state.length
        ran = ex.length
        depth = min(tree.depth, state.max_length - length - 1)
        candidates: list[np.ndarray] = []
        if depth > 0:
            proposal = self.proposer.propose(seq[:length], depth, tree.widths()[:depth])
            candidates = proposal.candidates or [t[None] for t in proposal.tokens[:depth]]
        pending = seq[ran:length]
        p = pending.shape[0]
        nodes, tokens = tree.nodes(candidates[:depth])
        room = state.max_length - ran - p  # the pass must fit: parents come first: cut the tail
        nodes, tokens = nodes[:room], tokens[:room]
        offsets, visible, parents = tree.layout(nodes)
        head = state.logits
        rows = np.zeros((0, self.vocab), np.float32)
        if p or nodes.size:
            full = np.zeros((p + nodes.size, p + nodes.size), bool)
            full[:p, :p] = np.tri(p, dtype=bool)
            full[p:, :p] = True
            full[p:, p:] = visible
            layout = TreePass(np.concatenate([np.arange(p), p - 1 + offsets]), full)
            rows = forward_rows(ex, np.concatenate([pending, tokens]), layout)

        def score(node: int) -> np.ndarray:
            path = []
            r = node
            while r >= 0:
                path.append(int(tokens[r]))
                r = int(parents[r])
            seq[length : length + len(path)] = path[::-1]
            if node >= 0:
                raw = rows[p + node]
            elif p:
                raw = rows[p - 1]  # after the last pending token: the root's prediction
            else:
                raw = head.reshape(-1)  # the generator's own pass already scored the root
            return self._scores(state, length + len(path), raw)

        path, token = walk_tree(parents, tokens, score, state.rng if self.sampled else None)
        self.proposer.observe_target(ex, p + path[-1] if path else p - 1)
        ex.keep(length, np.asarray(path, np.int64))
        self.proposer.observe(len(path))
        out = [int(tokens[r]) for r in path] + [token]
        seq[length : length + len(out)] = out
        self.rounds += 1
        if nodes.size:
            self.proposed += int(nodes.size)
            self.accepted += len(path)
            self.drafted_rounds += 1
            self.side_accepts += sum(1 for r in path if tree.paths[nodes[r]][-1] > 0)
        self.emitted += len(out)
        return out

    def _near_tie(self, target: np.ndarray, n: int, exact_first: bool) -> int | None:
        """The first greedy decision (rows 0..n) whose top-2 logit margin is below
        ``verify_margin``; row 0 is exact when it came from the generator's own pass."""
        if self.sampled or self.margin <= 0.0:
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
