"""Share-buffer cache: one buffer per layer bound as both ``past`` and ``present``;
GroupQueryAttention writes the new keys/values in place at each row's sequence length.

Each buffer spans ``max_length`` tokens but is an anonymous memory mapping: its pages are
zero-filled by the OS on first write, so resident memory follows the tokens actually written
(as the reference's up-front buffers do), nothing is ever copied to grow, and releasing the
cache unmaps it, handing the memory back to the system instead of leaving it with the
allocator (which growing by copy did: ~2x the KV size in RSS over long generations).

A released cache that held at most ``REUSE_LIMIT`` bytes of keys/values is kept for the next
cache of the same shapes (one set, process-wide): its pages are already mapped in, so the next
generation's prompt pass does not spend time on page faults (measured 2.6 % of a 37-token int4
SmolLM2 prefill at 1 thread). Old contents need no clearing: attention reads each row only up
to its sequence length, and every position below it is written by the generation that reads it.
Larger caches are unmapped on release, as before.

On a device (the CUDA provider) the buffers are device tensors of ``max_length`` tokens, made
once and bound as past and present: no key or value crosses to the host per step.
"""

from __future__ import annotations

import mmap
import threading
from typing import ClassVar

import numpy as np
import onnxruntime as ort

from ..session.bound import BoundSession
from ..session.device import HOST, Device
from .base import (
    KVCacheBase,
    KVLayout,
    bind_in_place,
    host_obstacle,
    move_rows,
    read_positions,
    write_positions,
)


def lazy_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zeroed array whose memory is committed page by page as it is written."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if nbytes == 0:
        return np.zeros(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype).reshape(shape)


REUSE_LIMIT = 64 << 20  # bytes of keys/values written; beyond this, give the memory back
_spare_lock = threading.Lock()
_spare: tuple[tuple, list[np.ndarray]] | None = None  # (shape, dtype, count), buffers


def _take_spare(key: tuple) -> list[np.ndarray] | None:
    global _spare
    with _spare_lock:
        if _spare is None or _spare[0] != key:
            return None
        arrays = _spare[1]
        _spare = None
        return arrays


def _keep_spare(key: tuple, arrays: list[np.ndarray]) -> None:
    global _spare
    with _spare_lock:
        _spare = (key, arrays)


class ShareBufferCache(KVCacheBase):
    kind: ClassVar[str] = "share-buffer"
    on_device: ClassVar[bool] = True
    # Captured decode steps may feed the whole [B, max_length] mask: GroupQueryAttention takes
    # each row's length from the mask's sum, so the width changes only how it splits its work.
    static_mask: ClassVar[bool] = True
    can_compact: ClassVar[bool] = True
    can_copy_rows: ClassVar[bool] = True  # on the host: rows sit at their positions

    def __init__(self, layout: KVLayout, batch_size: int, max_length: int, device: Device = HOST):
        if layout.format != "separate":
            raise ValueError("share-buffer needs separate [B, H, S, D] key/value caches")
        self.layout = layout
        self.device = device
        self.length = 0
        self._batch = batch_size
        self._max_length = max_length
        self._epoch = 0
        self._arrays: list[np.ndarray] = []
        self._values: list[ort.OrtValue] = []
        self._capacity = 0
        self._high = 0  # most tokens ever held: what was written, to decide reuse on release
        self._key: tuple = ()

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def nbytes(self) -> int:
        """Bytes of keys/values held (the mapped capacity beyond them is not resident)."""
        return self.length * self.layout.bytes_per_token(self._batch)

    def reserve(self, needed: int) -> None:
        """Make room for ``needed`` tokens: the first call maps ``max_length`` tokens lazily."""
        if needed <= self._capacity:
            return
        capacity = max(needed, self._max_length)
        # GroupQueryAttention refuses a buffer shorter than its local window, whatever is used.
        capacity = max(capacity, self.layout.window or 0)
        shape = self.layout.shape(self._batch, capacity)
        count = sum(len(p) for p in self.layout.past)
        if not self.device.host:
            self._reserve_on_device(shape, count, capacity)
            return
        key = (tuple(shape), np.dtype(self.layout.dtype).str, count)
        arrays = None if self._arrays else _take_spare(key)
        if arrays is None:
            arrays = []
            for i in range(count):
                array = lazy_zeros(shape, self.layout.dtype)
                if self._arrays and self.length:
                    array[:, :, : self.length] = self._arrays[i][:, :, : self.length]
                arrays.append(array)
        self._arrays = arrays
        self._key = key
        self._values = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
        self._capacity = capacity
        self._epoch += 1

    def _reserve_on_device(self, shape: tuple[int, ...], count: int, capacity: int) -> None:
        if self._values and self.length:  # grown past max_length: keep what is held
            self._values = self._device_splice(self._values, np.arange(self.length), capacity)
        else:
            self._values = self.device.zeros(shape, self.layout.dtype, count)
        self._capacity = capacity
        self._epoch += 1

    def _device_splice(
        self, values: list[ort.OrtValue], rows: np.ndarray, capacity: int
    ) -> list[ort.OrtValue]:
        """Each of ``values`` with positions ``rows`` first, padded with its own row 0 up to
        ``capacity`` (padding is never read: attention stops at each row's length)."""
        index = np.zeros(capacity, np.int64)
        index[: rows.size] = rows
        return self.device.take_many(values, index, axis=2)

    def __del__(self) -> None:
        arrays = getattr(self, "_arrays", None)
        if not arrays or _keep_spare is None:  # nothing mapped, or interpreter shutdown
            return
        if self._high * self.layout.bytes_per_token(self._batch) <= REUSE_LIMIT:
            _keep_spare(self._key, arrays)

    def bind(self, stage: BoundSession, num_new: int) -> None:
        self.reserve(self.length + num_new)
        if stage.kv_epoch == self._epoch:
            return  # already bound to these buffers: nothing to do per token
        names = [n for pair in zip(self.layout.past, self.layout.present) for n in zip(*pair)]
        bind_in_place(stage, names, self._values)
        stage.kv_epoch = self._epoch

    def advance(self, stage: BoundSession, num_new: int) -> None:
        self.length += num_new
        if self.length > self._high:  # per token: a compare, not a byte count
            self._high = self.length

    def rewind_to(self, length: int) -> None:
        # Attention reads only up to each row's sequence length, so rewinding is bookkeeping.
        self.length = min(self.length, length)

    def reorder(self, rows: np.ndarray) -> None:
        if not self.device.host:  # on the device: gathered there, buffers replaced
            if (rows != np.arange(rows.size)).any():
                self._values = self.device.take_many(self._values, rows, 0)
                self._epoch += 1
            return
        # On the host in place, only the positions held: the buffers stay bound as they are.
        move_rows(self._arrays, rows, 0, (slice(None), slice(0, self.length)))

    @property
    def copy_obstacle(self) -> str | None:
        return host_obstacle(self.kind, self.device)

    def _read(self, start: int, end: int) -> np.ndarray:
        return read_positions(self._arrays, start, end)

    def _write(self, start: int, rows: np.ndarray) -> None:
        end = start + rows.shape[2]
        self.reserve(end)
        write_positions(self._arrays, start, rows)
        self._high = max(self._high, end)

    def compact(self, start: int, keep: np.ndarray) -> None:
        """Keep the tokens before ``start`` and those at positions ``keep`` (in order), moved
        in place to ``start, start + 1, ...``."""
        end = start + keep.size
        if not self.device.host:  # on the device: gathered there, buffers replaced
            rows = np.concatenate([np.arange(start, dtype=np.int64), keep])
            self._values = self._device_splice(self._values, rows, self._capacity)
            self._epoch += 1
            self.length = end
            return
        for array in self._arrays:
            array[:, :, start:end] = array[:, :, keep]  # fancy indexing reads a copy first
        self.length = end
