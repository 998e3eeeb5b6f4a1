"""Concat cache: the graph appends new keys/values to ``past`` and returns ``present``; the
runtime feeds ``present`` back as the next ``past``. Works for separate and combined layouts.
On a device, ``present`` stays there (onnxruntime allocates it on the session's device) and a
rewind or compaction gathers the kept positions there."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..session.bound import BoundSession
from ..session.device import HOST, Device
from .base import KVCacheBase, KVLayout


class ConcatCache(KVCacheBase):
    kind: ClassVar[str] = "concat"
    formats: ClassVar[tuple[str, ...]] = ("separate", "combined")
    on_device: ClassVar[bool] = True
    can_compact: ClassVar[bool] = True
    can_copy_rows: ClassVar[bool] = True
    copies_from_device: ClassVar[bool] = True  # through the host, wherever the tensors live

    def __init__(self, layout: KVLayout, batch_size: int, max_length: int, device: Device = HOST):
        self.layout = layout
        self.device = device
        self.length = 0
        self._batch = batch_size
        self._past_names = [n for names in layout.past for n in names]
        self._present_names = [n for names in layout.present for n in names]
        self._empty = np.zeros(layout.shape(batch_size, 0), layout.dtype)
        self._reset()

    def _reset(self) -> None:
        empty = self.device.upload(self._empty)
        self._past = [empty] * len(self._past_names)

    @property
    def capacity(self) -> int:
        return self.length

    @property
    def nbytes(self) -> int:
        return self.length * self.layout.bytes_per_token(self._batch)

    def held_shape(self) -> list[int]:
        """The shape of the first cached tensor (what the graph last returned as present)."""
        return list(self._past[0].shape())

    def bind(self, stage: BoundSession, num_new: int) -> None:
        for name, value in zip(self._past_names, self._past):
            stage.bind_value(name, value)
        for name in self._present_names:
            stage.bind_output_alloc(name)

    def advance(self, stage: BoundSession, num_new: int) -> None:
        self._past = [stage.output(name) for name in self._present_names]
        self.length += num_new

    def rewind_to(self, length: int) -> None:
        if length == 0:
            self._reset()
        elif length < self.length:
            # A copy, never a view: a view would point into the dropped OrtValue's memory.
            kept = np.arange(length, dtype=np.int64)
            axis = self.layout.seq_axis
            self._past = self.device.take_many(self._past, kept, axis)
        self.length = min(self.length, length)

    def reorder(self, rows: np.ndarray) -> None:
        if self.length == 0 or (rows == np.arange(rows.size)).all():
            return
        axis = self.layout.batch_axis
        self._past = self.device.take_many(self._past, rows, axis)

    def compact(self, start: int, keep: np.ndarray) -> None:
        """Keep the tokens before ``start`` and those at positions ``keep`` (in order)."""
        index = np.concatenate([np.arange(start, dtype=np.int64), keep])
        axis = self.layout.seq_axis
        self._past = self.device.take_many(self._past, index, axis)
        self.length = index.size

    def _read(self, start: int, end: int) -> np.ndarray:
        parts = []
        for value in self._past:
            array = self.device.download(value)
            if self.layout.format == "combined":  # [2, B, H, S, D]: keys, then values
                parts.extend(array[:, 0, :, start:end])
            else:
                parts.append(array[0, :, start:end])
        return np.stack(parts)

    def _write(self, start: int, rows: np.ndarray) -> None:
        combined = self.layout.format == "combined"
        per = 2 if combined else 1
        axis = self.layout.seq_axis
        past = []
        for i, value in enumerate(self._past):
            kept = np.take(self.device.download(value), np.arange(start), axis=axis)
            part = rows[i * per : (i + 1) * per]  # [per, H, n, D]
            new = part[:, None] if combined else part  # [2, 1, H, n, D] or [1, H, n, D]
            past.append(self.device.upload(np.concatenate([kept, new], axis=axis)))
        self._past = past
