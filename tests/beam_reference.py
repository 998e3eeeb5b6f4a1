"""A NumPy beam search for the tests, written from onnxruntime-genai 0.18's behaviour and kept
apart from ``genai_runtime.decoding.beam`` (float64 log-probabilities, one full stable sort per
prompt and step, plain lists for the hypotheses).

Per prompt, ``num_beams`` rows; row 0 starts at score 0, the others at -1e9. Each step every
(row, token) pair is scored running score + log-softmax, sorted best first (ties: lower row, then
lower token); walking the first ``2 * num_beams`` (more if several EOS ids), an EOS among the
first ``num_beams`` closes the row as a hypothesis (its tokens without the EOS, scored
``sum / len(tokens) ** length_penalty``), other pairs become the next rows until there are
``num_beams``. A prompt with ``num_beams`` hypotheses is done when ``early_stopping`` is set or
its best candidate, penalized at the current length, cannot beat the worst hypothesis; the
reference reads that candidate from the flat [B * 2K] candidate scores at offset ``b * K``.
Finished prompts emit pad tokens. At the end the open rows of unfinished prompts are scored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class BeamRun:
    steps: list[list[int]] = field(default_factory=list)  # next tokens per step, all rows
    hypotheses: list[list[tuple[float, list[int]]]] = field(default_factory=list)  # per prompt


def _penalized(total: float, length: int, length_penalty: float) -> float:
    return total / float(length) ** length_penalty


def _keep(closed: list, tokens: list[int], total: float, size: int, length_penalty: float):
    score = _penalized(total, len(tokens), length_penalty)
    closed.append((score, tokens))
    closed.sort(key=lambda h: -h[0])  # stable: an equal later score stays behind
    del closed[size:]


def beam_search(
    next_logits: Callable[[int, np.ndarray, np.ndarray], np.ndarray],
    prompts: np.ndarray,
    *,
    num_beams: int,
    max_length: int,
    eos: Sequence[int],
    pad: int,
    length_penalty: float = 1.0,
    early_stopping: bool = True,
) -> BeamRun:
    """``next_logits(step, rows, live)`` gives the logits [B * K, V] after ``rows`` [B * K, T];
    ``live`` [B * K] marks the rows of unfinished prompts (the others only carry pads on)."""
    batch, k = prompts.shape[0], num_beams
    rows = [list(map(int, prompts[b])) for b in range(batch) for _ in range(k)]
    scores = np.array(([0.0] + [-1e9] * (k - 1)) * batch)
    closed: list[list] = [[] for _ in range(batch)]
    done = [False] * batch
    count = k * max(2, 1 + len(eos))
    run = BeamRun()
    while True:
        live = np.repeat(~np.array(done), k)
        logits = np.asarray(next_logits(len(run.steps), np.array(rows), live), np.float64)
        logp = logits - logits.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        vocab = logp.shape[1]
        length = len(rows[0])
        new_rows, new_scores, tokens, firsts = [], [], [], []
        for b in range(batch):
            total = (scores[b * k : (b + 1) * k, None] + logp[b * k : (b + 1) * k]).ravel()
            order = np.argsort(-total, kind="stable")[:count]
            firsts.append(total[order[: 2 * k]])  # finished prompts' candidates count here too
            if done[b]:
                new_rows += [rows[r] + [pad] for r in range(b * k, (b + 1) * k)]
                new_scores += [0.0] * k
                tokens += [pad] * k
                continue
            picked = []
            for j, flat in enumerate(order):
                beam, token = divmod(int(flat), vocab)
                if token in eos:
                    if j < k:
                        _keep(closed[b], rows[b * k + beam], total[flat], k, length_penalty)
                    continue
                picked.append((beam, token, total[flat]))
                if len(picked) == k:
                    break
            new_rows += [rows[b * k + beam] + [token] for beam, token, _ in picked]
            new_scores += [s for _, _, s in picked]
            tokens += [token for _, token, _ in picked]
        window = np.concatenate(firsts)
        for b in range(batch):
            if done[b] or len(closed[b]) < k:
                continue
            best = window[b * k : b * k + 2 * k].max()
            if early_stopping or closed[b][-1][0] >= _penalized(best, length, length_penalty):
                done[b] = True
        rows, scores = new_rows, np.array(new_scores)
        run.steps.append(tokens)
        if all(done) or len(rows[0]) >= max_length:
            break
    for b in range(batch):
        if not done[b]:
            for r in range(b * k, (b + 1) * k):
                _keep(closed[b], rows[r], scores[r], k, length_penalty)
        run.hypotheses.append(closed[b])
    return run
