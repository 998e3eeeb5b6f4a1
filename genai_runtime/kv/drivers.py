"""A generic cache for a graph that declares static-scatter driver inputs (``write_indices``,
``nonpad_kv_seqlen``) over ordinary 4-D caches: the wrapped cache does the work, the wrapper
feeds the drivers the valid lengths before and after each pass."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..session.bound import BoundSession
from .base import KVCache, KVCacheBase
from .static_scatter import RowDrivers

if TYPE_CHECKING:
    from ..session.positions import PositionState


class DriverFed(KVCacheBase):
    """Feeds the drivers around the wrapped cache. It declares the defaults: compacting would
    need the drivers re-fed per kept path, so token trees verify a linear branch instead."""

    def __init__(self, inner: KVCache, batch_size: int, positions: PositionState):
        self.inner = inner
        self.kind = inner.kind
        self.layout = inner.layout
        self._drivers = RowDrivers(inner.layout, batch_size, positions)

    @property
    def length(self) -> int:
        return self.inner.length

    @property
    def capacity(self) -> int:
        return self.inner.capacity

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes

    def bind(self, stage: BoundSession, num_new: int) -> None:
        self.inner.bind(stage, num_new)
        self._drivers.update(num_new)
        self._drivers.bind(stage)

    def advance(self, stage: BoundSession, num_new: int) -> None:
        self.inner.advance(stage, num_new)

    def rewind_to(self, length: int) -> None:
        self.inner.rewind_to(length)

    def reorder(self, rows: np.ndarray) -> None:
        self.inner.reorder(rows)

    # Rows are the wrapped cache's; the drivers follow the positions the executor records.
    @property
    def copy_obstacle(self) -> str | None:
        return self.inner.copy_obstacle

    @property
    def row_shape(self) -> tuple[np.dtype, tuple[int, int, int]]:
        return self.inner.row_shape

    def read_rows(self, start: int, end: int) -> np.ndarray:
        return self.inner.read_rows(start, end)

    def write_rows(self, start: int, rows: np.ndarray) -> None:
        self.inner.write_rows(start, rows)
