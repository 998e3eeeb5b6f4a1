"""Fixed-shape static caches (Windows ML composite style): the graph takes past K/V of a fixed
context ``[B, H, CTX, D]`` and a fixed chunk of ``C`` new tokens, and outputs only the new
tokens' K/V ``[B, H, C, D]``; the runtime keeps the cache and writes those rows itself. Every
input has a fixed shape, so prompts run in chunks of ``C`` padded tokens and a decode step is a
chunk holding one real token.

Two kinds, differing in where rows live and how the mask ``[B, CTX + C]`` is aligned:

- ``static-index-copy``: row ``p`` lives at slot ``p`` (the slot is fed as ``cache_position``);
  the mask is left-aligned (slots ``< valid`` are 1), chunks are right-padded. Full context, so
  running past ``CTX`` is an error.
- ``static-fifo``: the newest row sits at slot ``CTX - 1``; each pass slides the buffer left by
  the rows it adds, dropping the oldest. The mask is right-aligned, chunks are left-padded, and
  RoPE positions come from ``position_ids``. Generation goes on past ``CTX`` (a sliding window);
  rewinding is refused once rows have been dropped.

The mask's last ``C`` columns cover the chunk itself (1 for real tokens, 0 for padding); the
graph applies causality inside the chunk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ..errors import GenerationError
from ..session.bound import BoundSession
from .base import KVCacheBase, KVLayout, PreallocatedBuffers, move_rows

if TYPE_CHECKING:
    from ..session.positions import PositionState


class _FixedShapeCache(PreallocatedBuffers, KVCacheBase):
    kind: ClassVar[str]
    uses_positions: ClassVar[bool] = True
    left_padded: ClassVar[bool]  # where padding goes inside a chunk

    def __init__(
        self, layout: KVLayout, batch_size: int, max_length: int, positions: PositionState
    ):
        if layout.format != "separate" or not layout.static_capacity or not layout.new_rows:
            raise ValueError(f"{self.kind} needs a fixed [B, H, CTX, D] past and [B, H, C, D] new")
        self.layout = layout
        self.length = 0  # columns of the generator's sequence this cache has seen
        self.chunk = layout.new_rows
        self._capacity = layout.static_capacity
        self._batch = batch_size
        self._positions = positions
        self.valid = np.zeros(batch_size, np.int64)  # rows each batch entry holds
        self._names = [pair for layer in zip(layout.past, layout.present) for pair in zip(*layer)]
        shape = layout.shape(batch_size, self._capacity)
        self._allocate([shape] * len(self._names), layout.dtype)  # host: rows written here
        new_shape = layout.shape(batch_size, self.chunk)
        self._new = [np.zeros(new_shape, layout.dtype) for _ in self._names]
        ctx, c = self._capacity, self.chunk
        self.ids = np.zeros((batch_size, c), np.int64)
        self.position_ids = np.zeros((batch_size, c), np.int64)
        self.cache_position = np.zeros((batch_size, c), np.int64)
        self.mask = np.zeros((batch_size, ctx + c), np.int64)
        self.rows = np.zeros(batch_size, np.int64)  # real tokens per row in the current chunk
        self._cols = np.arange(c, dtype=np.int64)
        self._bound: set[int] = set()

    # -- one chunk ---------------------------------------------------------------------------

    def check_room(self, counts: np.ndarray) -> None:
        """Refuse a pass that cannot fit, before anything is written."""

    def fill(self, tokens: list[np.ndarray]) -> None:
        """Lay out one chunk: ``tokens[b]`` are row b's real tokens in it (at most ``C``)."""
        c = self.chunk
        self.ids[...] = 0
        self.position_ids[...] = 0
        self.mask[...] = 0
        for b, row in enumerate(tokens):
            k = len(row)
            self.rows[b] = k
            cols = slice(c - k, c) if self.left_padded else slice(0, k)
            self.ids[b, cols] = row
            np.add(self.valid[b], self._cols[:k], out=self.position_ids[b, cols])
            self.mask[b, self._capacity :][cols] = 1
            self._mask_past(b)
        # Slots the new rows take (pads continue counting, clipped to the context).
        np.add(self.valid[:, None], self._cols[None, :], out=self.cache_position)
        np.minimum(self.cache_position, self._capacity - 1, out=self.cache_position)

    def last_column(self, b: int) -> int:
        """The chunk column of row b's last real token."""
        return self.chunk - 1 if self.left_padded else int(self.rows[b]) - 1

    def bind(self, stage: BoundSession, num_new: int) -> None:
        if id(stage) in self._bound:
            return
        for (past, present), value, new in zip(self._names, self._values, self._new):
            stage.bind_value(past, value)
            stage.bind_output_array(present, new)
        self._bound.add(id(stage))

    def commit(self) -> None:
        """Write the real rows of the chunk just run into the cache."""
        for array, new in zip(self._arrays, self._new):
            for b in range(self._batch):
                k = int(self.rows[b])
                if k:
                    self._write(array[b], new[b], int(self.valid[b]), k)
        self.valid += self.rows

    def advance(self, stage: BoundSession, num_new: int) -> None:
        self.length += num_new

    def rewind_to(self, length: int) -> None:
        # Recomputed from the mask history even when ``length`` is not behind: a pass that
        # failed after some chunks were written restores the rows it had added.
        target = self._positions.valid_counts(min(length, self.length))
        if (target != self.valid).any():
            self._rewind_rows(target)
            self.valid[:] = target
        self.length = min(self.length, length)

    def reorder(self, rows: np.ndarray) -> None:
        move_rows(self._arrays, rows, 0)  # whole contexts: where rows sit depends on the kind
        self.valid[:] = self.valid[rows]

    def _mask_past(self, b: int) -> None:
        raise NotImplementedError

    def _write(self, rows: np.ndarray, new: np.ndarray, valid: int, k: int) -> None:
        raise NotImplementedError

    def _rewind_rows(self, target: np.ndarray) -> None:
        raise NotImplementedError


class StaticIndexCopyCache(_FixedShapeCache):
    kind: ClassVar[str] = "static-index-copy"
    left_padded: ClassVar[bool] = False

    def check_room(self, counts: np.ndarray) -> None:
        worst = int(np.argmax(self.valid + counts))
        if self.valid[worst] + counts[worst] > self._capacity:
            raise GenerationError(
                f"{self.layout.file}: {int(counts[worst])} new tokens after "
                f"{int(self.valid[worst])} (row {worst}) exceed the graph's fixed context of "
                f"{self._capacity} positions"
            )

    def _mask_past(self, b: int) -> None:
        self.mask[b, : self.valid[b]] = 1

    def _write(self, rows: np.ndarray, new: np.ndarray, valid: int, k: int) -> None:
        rows[:, valid : valid + k] = new[:, :k]

    def _rewind_rows(self, target: np.ndarray) -> None:
        pass  # slots past a row's valid count are masked and overwritten when reached


class StaticFifoCache(_FixedShapeCache):
    kind: ClassVar[str] = "static-fifo"
    # The FIFO drops its oldest rows: a rewind past them fails, so no speculation.
    can_rewind: ClassVar[bool] = False
    left_padded: ClassVar[bool] = True

    @property
    def evicted(self) -> bool:
        return bool((self.valid > self._capacity).any())

    def _mask_past(self, b: int) -> None:
        held = min(int(self.valid[b]), self._capacity)
        self.mask[b, self._capacity - held : self._capacity] = 1

    def _write(self, rows: np.ndarray, new: np.ndarray, valid: int, k: int) -> None:
        ctx, c = self._capacity, self.chunk
        if k < ctx:  # slide left by k (overlapping: NumPy buffers the copy)
            rows[:, : ctx - k] = rows[:, k:]
        rows[:, max(ctx - k, 0) :] = new[:, c - min(k, ctx) :]

    def _rewind_rows(self, target: np.ndarray) -> None:
        if (target == 0).all():
            return
        if self.evicted:
            raise GenerationError(
                f"cannot rewind to {int(target.max())} tokens: the FIFO cache keeps only the "
                f"last {self._capacity} positions and has dropped older ones (rewind_to(0) "
                "starts over)"
            )
        ctx = self._capacity
        for array in self._arrays:
            for b in range(self._batch):
                have, keep = int(self.valid[b]), int(target[b])
                if keep < have:  # the kept rows move right to end at the last slot
                    array[b, :, ctx - keep :] = array[b, :, ctx - have : ctx - have + keep].copy()
