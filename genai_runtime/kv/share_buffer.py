"""Share-buffer cache: one buffer per layer bound as both ``past`` and ``present``;
GroupQueryAttention writes the new keys/values in place at each row's sequence length.

The graph accepts any buffer at least as long as the total sequence, so capacity grows in
chunks (copy + re-bind) instead of pinning ``max_length`` tokens of memory up front.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import onnxruntime as ort

from ..runtime.bound import BoundSession
from .base import KVLayout

GROWTH_TOKENS = 256


class ShareBufferCache:
    kind: ClassVar[str] = "share-buffer"

    def __init__(
        self, layout: KVLayout, batch_size: int, max_length: int, growth: int = GROWTH_TOKENS
    ):
        if layout.format != "separate":
            raise ValueError("share-buffer needs separate [B, H, S, D] key/value caches")
        self.layout = layout
        self.length = 0
        self._batch = batch_size
        self._max_length = max_length
        self._growth = growth
        self._epoch = 0
        self._arrays: list[np.ndarray] = []
        self._values: list[ort.OrtValue] = []
        self._capacity = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays)

    def reserve(self, needed: int) -> None:
        """Make room for ``needed`` tokens, growing by whole chunks up to max_length."""
        if needed <= self._capacity:
            return
        chunks = -(-needed // self._growth)
        capacity = max(needed, min(self._max_length, chunks * self._growth))
        # GroupQueryAttention refuses a buffer shorter than its local window, whatever is used.
        capacity = max(capacity, self.layout.window or 0)
        shape = self.layout.shape(self._batch, capacity)
        arrays = []
        for i in range(sum(len(p) for p in self.layout.past)):
            array = np.zeros(shape, self.layout.dtype)
            if self._arrays and self.length:
                array[:, :, : self.length] = self._arrays[i][:, :, : self.length]
            arrays.append(array)
        self._arrays = arrays
        self._values = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
        self._capacity = capacity
        self._epoch += 1

    def bind(self, stage: BoundSession, num_new: int) -> None:
        self.reserve(self.length + num_new)
        if stage.kv_epoch == self._epoch:
            return  # already bound to these buffers: nothing to do per token
        i = 0
        for past, present in zip(self.layout.past, self.layout.present):
            for past_name, present_name in zip(past, present):
                stage.bind_value(past_name, self._values[i])
                stage.bind_output_value(present_name, self._values[i])
                i += 1
        stage.kv_epoch = self._epoch

    def advance(self, stage: BoundSession, num_new: int) -> None:
        self.length += num_new

    def rewind_to(self, length: int) -> None:
        # Attention reads only up to each row's sequence length, so rewinding is bookkeeping.
        self.length = min(self.length, length)
