"""Graph-scattered fixed-context cache (QEfficient style): past K/V ``[B, H, ctx_len, D]`` in,
the whole updated cache out; the graph writes the new rows at ``position_ids`` itself (padding
rows carry position -1) and may read the cache block by block (BlockedKV). One buffer per tensor
is bound as both past and present, so the runtime copies nothing per step; the graph's own
scatter updates it in place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np
import onnxruntime as ort

from ..errors import GenerationError
from ..session.bound import BoundSession
from .base import KVCacheBase, KVLayout, PreallocatedBuffers, bind_in_place, move_rows

if TYPE_CHECKING:
    from ..session.positions import PositionState

PAD_POSITION = -1


class GraphScatteredCache(PreallocatedBuffers, KVCacheBase):
    kind: ClassVar[str] = "graph-scattered"
    uses_positions: ClassVar[bool] = True

    def __init__(
        self, layout: KVLayout, batch_size: int, max_length: int, positions: PositionState
    ):
        if layout.format != "separate" or not layout.static_capacity:
            raise ValueError("graph-scattered needs [B, H, ctx_len, D] caches fixed by the graph")
        self.layout = layout
        self.length = 0
        self._capacity = layout.static_capacity
        self._positions = positions
        shape = layout.shape(batch_size, self._capacity)
        self._names = [
            pair
            for past, present in zip(layout.past, layout.present)
            for pair in zip(past, present)
        ]
        self._arrays = [np.zeros(shape, layout.dtype) for _ in self._names]
        self._values = [ort.OrtValue.ortvalue_from_numpy(a) for a in self._arrays]
        self._bound: set[int] = set()

    def bind(self, stage: BoundSession, num_new: int) -> None:
        if self.length + num_new > self._capacity:
            raise GenerationError(
                f"{self.layout.file}: {num_new} new tokens after {self.length} exceed the "
                f"graph's fixed context of {self._capacity} positions"
            )
        self._positions.mark_pads(num_new, PAD_POSITION)
        if id(stage) in self._bound:
            return
        bind_in_place(stage, self._names, self._values)
        self._bound.add(id(stage))

    def advance(self, stage: BoundSession, num_new: int) -> None:
        self.length += num_new

    def rewind_to(self, length: int) -> None:
        # Rows past a query's position are masked by the graph and overwritten when reached.
        self.length = min(self.length, length)

    def reorder(self, rows: np.ndarray) -> None:
        move_rows(self._arrays, rows, 0, (slice(None), slice(0, self.length)))
