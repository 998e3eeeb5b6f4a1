"""Sliding-window cache for share-buffer graphs whose local layers use GroupQueryAttention's
``local_window_size`` with ``sliding_window_cache``: each windowed layer keeps one fixed buffer of
``window + slack`` rows and the kernel evicts the oldest rows inside it; the other (global)
layers share a growing share-buffer cache. This is how onnxruntime-genai sizes them on CPU, and
the buffer size changes the kernel's summation order, so matching it keeps tokens identical.

Once rows have been evicted a position no longer sits at its own offset, so rewinding is refused.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import onnxruntime as ort

from ..errors import GenerationError
from ..session.bound import BoundSession
from .base import KVCacheBase, KVLayout, bind_in_place, move_rows
from .share_buffer import ShareBufferCache

DEFAULT_SLACK = 16  # the reference's CPU default when cache_slack is 0


class SlidingWindowCache(KVCacheBase):
    kind: ClassVar[str] = "sliding-window"
    # Windowed layers evict: a rewind past what they dropped fails, so no speculation.
    can_rewind: ClassVar[bool] = False
    cannot_copy: ClassVar[str] = (
        "its windowed layers keep the last window + slack positions in a buffer that the kernel "
        "rotates in place, so a position does not sit at an offset a copy could address"
    )

    def __init__(self, layout: KVLayout, batch_size: int, max_length: int):
        if layout.format != "separate" or not layout.window:
            raise ValueError("sliding-window needs separate [B, H, S, D] caches and a window size")
        self.layout = layout
        self.length = 0
        layers = range(layout.num_layers)
        windowed = [i for i in layers if not layout.window_layers or i in layout.window_layers]
        full = [i for i in layers if i not in windowed]
        slack = layout.window_slack or DEFAULT_SLACK
        # Never below the window: GroupQueryAttention refuses a shorter buffer.
        self.window_capacity = max(layout.window, min(layout.window + slack, max_length))
        shape = layout.shape(batch_size, self.window_capacity)
        self._names = [pair for i in windowed for pair in zip(layout.past[i], layout.present[i])]
        self._arrays = [np.zeros(shape, layout.dtype) for _ in self._names]
        self._values = [ort.OrtValue.ortvalue_from_numpy(a) for a in self._arrays]
        self._full: ShareBufferCache | None = None
        if full:
            sub = dataclasses.replace(
                layout,
                past=tuple(layout.past[i] for i in full),
                present=tuple(layout.present[i] for i in full),
                window=None,
                window_layers=(),
            )
            self._full = ShareBufferCache(sub, batch_size, max_length)
        self._bound: set[int] = set()  # stages whose binding holds the windowed buffers

    @property
    def capacity(self) -> int:
        """Tokens held without eviction (the global layers' buffer when there are any)."""
        return self._full.capacity if self._full else self.window_capacity

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays) + (self._full.nbytes if self._full else 0)

    @property
    def evicted(self) -> bool:
        return self.length > self.window_capacity

    def bind(self, stage: BoundSession, num_new: int) -> None:
        if self._full is not None:
            self._full.bind(stage, num_new)
        if id(stage) in self._bound:
            return
        bind_in_place(stage, self._names, self._values)
        self._bound.add(id(stage))

    def advance(self, stage: BoundSession, num_new: int) -> None:
        if self._full is not None:
            self._full.advance(stage, num_new)
        self.length += num_new

    def rewind_to(self, length: int) -> None:
        if 0 < length < self.length and self.evicted:
            raise GenerationError(
                f"cannot rewind to {length}: the windowed layers keep only the last "
                f"{self.window_capacity} of {self.length} positions and have evicted the rest "
                "(rewind_to(0) starts over)"
            )
        if length == 0 and self.evicted:
            for array in self._arrays:  # starting over: no evicted layout may linger
                array[...] = 0
        if self._full is not None:
            self._full.rewind_to(length)
        self.length = min(self.length, length)

    def reorder(self, rows: np.ndarray) -> None:
        move_rows(self._arrays, rows, 0)  # whole windows: eviction has rotated their rows
        if self._full is not None:
            self._full.reorder(rows)
