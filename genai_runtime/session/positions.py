"""attention_mask, position_ids and sequence-length scalars, following onnxruntime-genai's rules.

Batches are right-padded: on the prompt pass a row's trailing pad tokens get mask 0 and position
0, every other column mask 1 and its column index as position; each later token gets mask 1 and
the row's next position. Batch 1 has no padding: all ones, positions 0..n-1, and continues from
the total length on every later pass (multi-turn appends included).

Histories live in ``[B, max_length]`` buffers so rewinding is an index change.
"""

from __future__ import annotations

import numpy as np


class PositionState:
    def __init__(
        self,
        batch_size: int,
        max_length: int,
        pad_token_id: int | None,
        mask_dtype: np.dtype | type = np.int64,
        pos_dtype: np.dtype | type = np.int64,
    ):
        self.batch_size = batch_size
        self.length = 0
        self._pad = pad_token_id
        self._mask = np.zeros((batch_size, max_length), mask_dtype)
        # Batch 1's mask is all ones up to its length (no padding): any prefix of this buffer
        # is it. Read-only, so a device copy of it is made once and never refreshed.
        self._ones = np.ones((1, max_length), mask_dtype)
        self._ones.flags.writeable = False
        self._pos = np.zeros((batch_size, max_length), pos_dtype)
        self._next = np.zeros(batch_size, np.int64)  # next position per row
        self._prompt_next = np.zeros(batch_size, np.int64)
        self._prompt_length = 0
        self._pad_position = 0
        self.last_index = np.zeros(batch_size, np.int64)  # logits row per batch entry, this pass
        if batch_size > 1:  # contiguous [B, T] copies for the graph
            self._mask_out = np.zeros(batch_size * max_length, mask_dtype)
            self._pos_out = np.zeros(batch_size * max_length, pos_dtype)

    def update(self, tokens: np.ndarray) -> None:
        """Record a pass over ``tokens`` [B, n] appended at column ``length``."""
        n = tokens.shape[1]
        start, end = self.length, self.length + n
        if start == 0 and self.batch_size > 1:
            self._prompt(tokens)
        elif self.batch_size == 1:
            self._mask[0, start:end] = 1
            if n == 1:  # the per-token case: no temporary arrays
                self._pos[0, start] = start
            else:
                self._pos[0, start:end] = np.arange(start, end)
            self.last_index[0] = n - 1
        else:
            # Continuing a padded batch: one token per row, at each row's next position.
            self._mask[:, start:end] = 1
            self._pos[:, start:end] = self._next[:, None] + np.arange(n)
            self._next += n
            self.last_index[:] = n - 1
        self.length = end

    def _prompt(self, tokens: np.ndarray) -> None:
        n = tokens.shape[1]
        real = tokens != self._pad if self._pad is not None else np.ones_like(tokens, bool)
        # Index of the last non-pad token per row (-1 if the row is all padding).
        last = np.where(real.any(axis=1), n - 1 - np.argmax(real[:, ::-1], axis=1), -1)
        cols = np.arange(n)
        keep = cols[None, :] <= last[:, None]
        self._mask[:, :n] = keep
        self._pos[:, :n] = np.where(keep, cols[None, :], self._pad_position)
        self._next[:] = last + 1
        self._prompt_next[:] = self._next
        self._prompt_length = n
        self.last_index[:] = np.maximum(last, 0)

    def rows_before(self, n: int, out: np.ndarray) -> None:
        """Fill an int64 ``[B]`` array with each row's valid (non-pad) tokens before the pass of
        ``n`` tokens just recorded (0 on a prompt pass, pad columns included in none)."""
        if self.batch_size == 1:
            out[0] = self.length - n
        elif self.length == n:
            out[:] = 0
        else:
            np.subtract(self._next, n, out=out)

    def valid_counts(self, length: int) -> np.ndarray:
        """Each row's real (unmasked) tokens among the first ``length`` columns, int64 [B]."""
        return self._mask[:, :length].sum(axis=1, dtype=np.int64)

    def real_columns(self, start: int, n: int) -> np.ndarray:
        """bool [B, n]: which columns of the pass recorded at ``start`` hold real tokens."""
        return self._mask[:, start : start + n] != 0

    def pad_positions_with(self, value: int) -> None:
        """Give the pad columns of a padded prompt ``value`` as their position id (default 0):
        graphs that scatter at positions skip -1. Set before the prompt is recorded, so the ids
        handed out carry it (a device copies them when they are fed)."""
        self._pad_position = value

    @property
    def prompt_length(self) -> int:
        return self._prompt_length

    def rewind_to(self, length: int) -> None:
        old, self.length = self.length, min(self.length, length)
        self._mask[:, self.length : old] = 0  # ``static_mask`` reads past the length
        if self.batch_size > 1 and self.length:
            if self.length <= self._prompt_length:
                self._next[:] = self._prompt_next
            else:
                self._next[:] = self._pos[:, self.length - 1] + 1

    def branch(self, offsets: np.ndarray) -> None:
        """Batch 1, a token tree: the tokens of the pass just recorded sit at ``start + offsets``
        (each node at its depth, so siblings share a position)."""
        n = offsets.shape[0]
        self._pos[0, self.length - n : self.length] = self.length - n + offsets

    def straighten(self, start: int, length: int) -> None:
        """After a tree pass kept one path: ``length`` tokens, positions consecutive again."""
        self.rewind_to(length)
        self._pos[0, start:length] = np.arange(start, length)

    def mask(self) -> np.ndarray:
        """The ``[B, total]`` attention mask for the pass just recorded (contiguous)."""
        if self.batch_size == 1:
            return self._mask[:, : self.length]
        out = self._mask_out[: self.batch_size * self.length].reshape(self.batch_size, -1)
        out[...] = self._mask[:, : self.length]
        return out

    def mask_buffer(self) -> tuple[np.ndarray, tuple[int, int]]:
        """A buffer of fixed shape whose leading elements hold the ``[B, total]`` mask of the
        pass just recorded, and that shape (``BoundSession.feed_prefix`` binds them)."""
        if self.batch_size == 1:  # all ones up to the length: one constant buffer serves
            return self._ones, (1, self.length)
        self.mask()
        return self._mask_out, (self.batch_size, self.length)

    def static_mask(self) -> np.ndarray:
        """The ``[B, max_length]`` mask: 1 where a row has a real token, 0 after its length.
        Its shape never changes, so a device tensor holding it stays at one address."""
        return self._mask

    def positions(self, n: int) -> np.ndarray:
        """The ``[B, n]`` position ids of the pass just recorded (contiguous)."""
        start = self.length - n
        if self.batch_size == 1:
            return self._pos[:, start : self.length]
        out = self._pos_out[: self.batch_size * n].reshape(self.batch_size, n)
        out[...] = self._pos[:, start : self.length]
        return out


def encoder_source(
    tokens: np.ndarray, counts, width: int, pad: int, eos: int
) -> tuple[np.ndarray, np.ndarray]:
    """A text encoder's ids and mask ``[B, width]`` (onnxruntime-genai's encoder-decoder rule):
    each row's first ``counts[b]`` tokens, then EOS, right-padded with ``pad``."""
    batch = tokens.shape[0]
    ids = np.full((batch, width), pad, np.int64)
    mask = np.zeros((batch, width), np.int64)
    for row, count in enumerate(counts):
        ids[row, :count] = tokens[row, :count]
        ids[row, count] = eos
        mask[row, : count + 1] = 1
    return ids, mask
