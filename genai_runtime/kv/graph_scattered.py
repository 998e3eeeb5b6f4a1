"""Graph-scattered fixed-context cache (QEfficient style): past K/V ``[B, H, ctx_len, D]`` in,
the whole updated cache out; the graph writes the new rows at ``position_ids`` itself (padding
rows carry position -1) and may read the cache block by block (BlockedKV). One buffer per tensor
is bound as both past and present, so the runtime copies nothing per step; the graph's own
scatter updates it in place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ..errors import GenerationError
from ..session.bound import BoundSession
from ..session.device import HOST, Device
from .base import (
    KVCacheBase,
    KVLayout,
    PreallocatedBuffers,
    bind_in_place,
    host_obstacle,
    read_positions,
    write_positions,
)

if TYPE_CHECKING:
    from ..session.positions import PositionState

PAD_POSITION = -1


class GraphScatteredCache(PreallocatedBuffers, KVCacheBase):
    kind: ClassVar[str] = "graph-scattered"
    uses_positions: ClassVar[bool] = True
    on_device: ClassVar[bool] = True  # the graph writes its buffers in place
    can_copy_rows: ClassVar[bool] = True  # on the host: each row sits at its position

    def __init__(
        self,
        layout: KVLayout,
        batch_size: int,
        max_length: int,
        positions: PositionState,
        device: Device = HOST,
    ):
        if layout.format != "separate" or not layout.static_capacity:
            raise ValueError("graph-scattered needs [B, H, ctx_len, D] caches fixed by the graph")
        self.layout = layout
        self.length = 0
        self._capacity = layout.static_capacity
        positions.pad_positions_with(PAD_POSITION)
        shape = layout.shape(batch_size, self._capacity)
        self._names = [
            pair
            for past, present in zip(layout.past, layout.present)
            for pair in zip(past, present)
        ]
        self._device = device
        self._allocate([shape] * len(self._names), layout.dtype)
        self._bound: set[int] = set()

    def bind(self, stage: BoundSession, num_new: int) -> None:
        if self.length + num_new > self._capacity:
            raise GenerationError(
                f"{self.layout.file}: {num_new} new tokens after {self.length} exceed the "
                f"graph's fixed context of {self._capacity} positions"
            )
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
        if self._move_rows(rows, (slice(None), slice(0, self.length))):
            self._bound.clear()  # new tensors: every stage binds them again

    @property
    def copy_obstacle(self) -> str | None:
        return host_obstacle(self.kind, self._device)

    def _read(self, start: int, end: int) -> np.ndarray:
        return read_positions(self._arrays, start, end)

    def _write(self, start: int, rows: np.ndarray) -> None:
        if start + rows.shape[2] > self._capacity:
            raise GenerationError(
                f"{self.layout.file}: {start + rows.shape[2]} positions exceed the graph's "
                f"fixed context of {self._capacity}"
            )
        write_positions(self._arrays, start, rows)
