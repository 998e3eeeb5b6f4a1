"""Whisper's long-form rules as pure functions: which tokens may come next, where segments end."""

from __future__ import annotations

import numpy as np

from genai_runtime.audio.longform import TimestampVocab, split_segments, timestamp_logits


def _vocab() -> TimestampVocab:
    # A toy Whisper vocabulary: text 0..9, eot 10, markers 11..12, timestamps 13..22 (0.1 s).
    return TimestampVocab(eot=10, begin=13, count=10, seconds=0.1, no_speech=11)


def test_timestamp_rules() -> None:
    vocab = _vocab()
    logits = np.zeros(23, np.float32)
    first = timestamp_logits(logits, [], vocab, max_initial=2)
    assert np.isfinite(first).nonzero()[0].tolist() == [13, 14, 15]  # a timestamp <= 0.2 s
    # After text + timestamp (a segment's end): only a timestamp at least as late, or the end.
    likely_end = logits.copy()
    likely_end[10] = 5.0
    after_end = timestamp_logits(likely_end, [14, 3, 17], vocab, max_initial=2)
    assert np.isfinite(after_end).nonzero()[0].tolist() == [10, *range(17, 23)]
    # After a pair (end + start): text or the end, no timestamp.
    after_pair = timestamp_logits(logits, [14, 3, 17, 17], vocab, max_initial=2)
    assert np.isfinite(after_pair).nonzero()[0].tolist() == list(range(11))
    # Inside a segment, timestamps never go back and a segment is never empty.
    inside = timestamp_logits(logits, [15, 3], vocab, max_initial=2)
    assert np.isfinite(inside[13:16]).sum() == 0 and np.isfinite(inside[16:]).all()
    # Timestamps whose total probability beats every text token take the step.
    peaked = np.zeros(23, np.float32)
    peaked[16:] = 1.0
    assert not np.isfinite(timestamp_logits(peaked, [15, 3], vocab, 2)[:13]).any()


def test_segments_split_at_timestamp_pairs() -> None:
    vocab = _vocab()
    # <0.0> a b <0.4><0.4> c <0.9> : two complete segments; the next window starts at 0.9 s.
    segments, resume = split_segments([13, 1, 2, 17, 17, 3, 22], vocab)
    assert segments == [(0, 4, [1, 2]), (4, 9, [3])] and resume == 9
    # The output ends after one segment, before the window does: go on from its end.
    assert split_segments([13, 1, 2, 16], vocab) == ([(0, 3, [1, 2])], 3)
    # The last segment is cut off by the window: resume at its start.
    segments, resume = split_segments([13, 1, 17, 17, 3, 4], vocab)
    assert segments == [(0, 4, [1])] and resume == 4
    # No segment completed: the text runs to the end of the window.
    assert split_segments([13, 1, 2], vocab) == ([(0, -1, [1, 2])], None)
    assert split_segments([13], vocab) == ([], None)
