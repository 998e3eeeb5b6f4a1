"""Beam search as onnxruntime-genai 0.18 runs it: the NumPy step (``best_candidates``) and the
bookkeeping of one generation (``BeamScorer``).

Every prompt keeps ``num_beams`` rows. A step turns each row's processed logits into
log-probabilities, adds the row's running score, and walks the best ``2 * num_beams``
(beam, token) pairs of the prompt in order: an EOS among the first ``num_beams`` closes a
hypothesis (the row's tokens without the EOS, scored ``sum / length ** length_penalty`` with the
prompt counted in the length), other tokens fill the next rows until ``num_beams`` are found.
A prompt is done once it holds ``num_beams`` hypotheses and either ``early_stopping`` is set or
its best candidate, length-penalized, could not beat the worst of them. When generation ends,
the rows still open are scored the same way over their whole sequence.

``diversity_penalty`` is accepted and has no effect, as in the reference (it has no beam groups).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from ..errors import GenerationError, UnsupportedError
from ..spec import GenerationSpec

MAX_BEAMS = 32  # the reference's bound on num_beams
# Rows 1.. of a prompt start this low, so the first step does not pick one token num_beams times.
OTHER_ROWS_START = np.float32(-1e9)


def check_beam_search(
    search: GenerationSpec, *, greedy: bool, grammar: bool, vocab_size: int
) -> None:
    """Refuse options beam search cannot run with (the reference's checks and wording)."""
    beams, returned = search.num_beams, search.num_return_sequences
    if not 1 <= beams <= MAX_BEAMS:
        raise GenerationError(f"num_beams ({beams}) must be in [1, {MAX_BEAMS}]")
    if not 1 <= returned <= beams:
        raise GenerationError(f"num_return_sequences ({returned}) must be in [1, {beams}]")
    if beams == 1:
        return
    if not greedy:
        raise GenerationError(
            "TopK and TopP cannot be used with a beam search (num_beams > 1 needs greedy "
            "decoding: do_sample false, top_k 1 or temperature 0, or an argmax chain)"
        )
    if grammar:
        raise UnsupportedError("guidance (a grammar) cannot be combined with beam search")
    if vocab_size < 2:
        raise GenerationError(f"vocab_size ({vocab_size}) must be 2 or greater for beam search")


def log_softmax(logits: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """Each row of float32 ``logits`` [N, V] as log-probabilities, in place; ``scratch`` (same
    shape) takes the exponentials so nothing is allocated per call."""
    logits -= logits.max(axis=1, keepdims=True)
    exps = np.exp(logits, out=scratch)
    logits -= np.log(exps.sum(axis=1, keepdims=True, dtype=np.float64)).astype(np.float32)
    return logits


def best_candidates(
    scores: np.ndarray, num_beams: int, count: int, scratch: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``count`` best (beam, token) pairs of each prompt in ``scores`` [B * K, V], best first
    (ties: lower beam, then lower token). Returns values, beams (0..K-1) and tokens, each
    [B, count]. ``scratch`` (the shape of ``scores``) takes the negated scores."""
    vocab = scores.shape[1]
    flat = scores.reshape(-1, num_beams * vocab)
    count = min(count, flat.shape[1])
    # Selecting the smallest negated scores: numpy's partition stays fast when many scores tie
    # (masked logits), where selecting the largest from the back slows down ~50x.
    negated = np.negative(flat, out=None if scratch is None else scratch.reshape(flat.shape))
    picked = np.argpartition(negated, count - 1, axis=1)[:, :count]
    values = np.take_along_axis(flat, picked, axis=1)
    order = np.lexsort((picked, -values))
    picked = np.take_along_axis(picked, order, axis=1)
    values = np.take_along_axis(values, order, axis=1)
    return values, picked // vocab, (picked % vocab).astype(np.int32)


class Hypotheses:
    """The best ``size`` closed hypotheses of one prompt, best first; a later equal score goes
    after the earlier ones, and one no better than the worst of a full list is dropped."""

    def __init__(self, size: int, length_penalty: float):
        self.size = size
        self.length_penalty = np.float32(length_penalty)
        self.scores: list[float] = []  # negated, ascending: bisect keeps the order
        self.tokens: list[np.ndarray] = []

    def __len__(self) -> int:
        return len(self.scores)

    def penalized(self, sum_logprobs: float, length: int) -> np.float32:
        return np.float32(sum_logprobs) / np.float32(length) ** self.length_penalty

    def add(self, tokens: np.ndarray, sum_logprobs: float) -> None:
        score = self.penalized(sum_logprobs, len(tokens))
        if len(self.scores) == self.size and score <= -self.scores[-1]:
            return
        at = bisect.bisect_right(self.scores, -score)
        self.scores.insert(at, -float(score))
        self.tokens.insert(at, tokens)
        del self.scores[self.size :], self.tokens[self.size :]

    def can_improve(self, best_sum_logprobs: float, length: int) -> bool:
        return -self.scores[-1] < self.penalized(best_sum_logprobs, length)

    def copy(self) -> Hypotheses:
        out = Hypotheses(self.size, float(self.length_penalty))
        out.scores, out.tokens = list(self.scores), list(self.tokens)
        return out

    def results(self) -> list[tuple[float, np.ndarray]]:
        return [(-s, t) for s, t in zip(self.scores, self.tokens)]


class BeamScorer:
    """One beam search over ``batch_size`` prompts of ``num_beams`` rows each (row ``b * K + j``
    is beam j of prompt b). ``step`` chooses the next rows; ``results`` lists the hypotheses."""

    def __init__(
        self,
        batch_size: int,
        num_beams: int,
        *,
        length_penalty: float,
        early_stopping: bool,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
    ):
        self.batch_size = batch_size
        self.num_beams = num_beams
        self.early_stopping = early_stopping
        self.pad_token_id = pad_token_id
        self._eos = frozenset(int(e) for e in eos_token_ids)
        rows = batch_size * num_beams
        # 2 * K as the reference; more when several EOS ids could crowd out K open rows.
        self._count = num_beams * max(2, 1 + len(self._eos))
        self.scores = np.zeros(rows, np.float32)  # each row's running sum of log-probabilities
        self.scores.reshape(batch_size, num_beams)[:, 1:] = OTHER_ROWS_START
        self.tokens = np.zeros(rows, np.int32)  # the last step's next token per row
        self.rows = np.arange(rows, dtype=np.int64)  # the last step's source row per row
        self.done = np.zeros(batch_size, bool)
        self._closed = [Hypotheses(num_beams, length_penalty) for _ in range(batch_size)]
        self._scratch: np.ndarray | None = None

    @property
    def is_done(self) -> bool:
        return bool(self.done.all())

    def step(self, sequences: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Choose the next rows from the processed ``logits`` [B * K, V] (float32, overwritten)
        that follow ``sequences`` [B * K, T]. Returns the next token per row and the row each
        continues (row i extends old row ``rows[i]``); both are reused by the next step."""
        k = self.num_beams
        if self._scratch is None or self._scratch.shape != logits.shape:
            self._scratch = np.empty_like(logits)
        log_softmax(logits, self._scratch)
        logits += self.scores[:, None]
        values, beams, tokens = best_candidates(logits, k, self._count, self._scratch)
        # The reference reads each prompt's best candidate from the flat [B * 2K] candidate
        # scores at offset b * K (not b * 2K); the same window keeps its stopping step.
        window = np.ascontiguousarray(values[:, : 2 * k]).ravel()
        length = sequences.shape[1]
        for b in range(self.batch_size):
            base = b * k
            if self.done[b]:
                self.tokens[base : base + k] = self.pad_token_id
                self.scores[base : base + k] = 0.0
                self.rows[base : base + k] = base
                continue
            closed, filled = self._closed[b], 0
            for j in range(values.shape[1]):
                token, row = int(tokens[b, j]), base + int(beams[b, j])
                if token in self._eos:
                    if j < k:
                        closed.add(sequences[row].copy(), values[b, j])
                    continue
                self.scores[base + filled] = values[b, j]
                self.tokens[base + filled] = token
                self.rows[base + filled] = row
                filled += 1
                if filled == k:
                    break
            if len(closed) < k:
                continue
            if not self.early_stopping:
                best = window[base : base + 2 * k].max()
                if closed.can_improve(best, length):
                    continue
            self.done[b] = True
        return self.tokens, self.rows

    def results(self, sequences: np.ndarray) -> list[list[tuple[float, np.ndarray]]]:
        """Per prompt, its ``num_beams`` hypotheses best first as (score, tokens): the closed
        ones, plus each row of an unfinished prompt scored over all of ``sequences`` [B*K, T].
        Leaves the search as it was."""
        out = []
        for b, closed in enumerate(self._closed):
            hypotheses = closed.copy()
            if not self.done[b]:
                for row in range(b * self.num_beams, (b + 1) * self.num_beams):
                    hypotheses.add(sequences[row].copy(), self.scores[row])
            out.append(hypotheses.results())
        return out
