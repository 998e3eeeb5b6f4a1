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

The mask comes in two widths, read from the graph. ``[B, CTX + C]``: the graph attends over the
past with the chunk appended, and the mask's last ``C`` columns cover the chunk itself (1 for
real tokens, 0 for padding). ``[B, CTX]`` (the designs' exports): the graph writes the chunk into
its own copy of the past first (index_copy at ``cache_position``, or Slice + Concat dropping the
oldest ``C`` rows) and attends over that, so the mask covers the slots after that write. Either
way the graph applies causality inside the chunk. An index-copy graph that writes in the graph
writes every column of a chunk, pads included, so a padded chunk must fit the context; its
``cache_position`` may be one ``[C]`` vector for the whole batch (rows then hold equal lengths).

On a device the past buffers are device tensors made once and bound once by address, and each
graph's new rows land in device tensors bound once too; after a pass a small graph on the same
provider writes the real rows into the buffers there (index-copy: a ScatterElements in place;
FIFO: the buffers slide by a gather over past and new rows). Only per-row counts cross to the
device, never the cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import onnxruntime as ort

from ..errors import GenerationError, ModelError
from ..session import census
from ..session.bound import BoundSession
from ..session.device import (
    HOST,
    Device,
    StagedArray,
    slide_rows_session,
    write_rows_session,
)
from .base import KVCacheBase, KVLayout, PreallocatedBuffers

if TYPE_CHECKING:
    from ..session.positions import PositionState


@dataclass(frozen=True)
class ChunkShape:
    """How one graph takes a chunk: its ``chunk`` new tokens, and whether it writes them into its
    own copy of the past before attending (a ``[B, CTX]`` mask) or attends over past + chunk (a
    ``[B, CTX + C]`` mask). A prefill graph and a one-token decode graph share one cache."""

    chunk: int
    in_graph: bool = False

    def mask_width(self, ctx: int) -> int:
        return ctx if self.in_graph else ctx + self.chunk


class _ChunkBuffers:
    """The per-pass inputs of one chunk shape, and the new rows its graph returns: host arrays
    (``new``), or on a device tensors there (``new_values``) with the binding of the graph that
    writes them into the cache (``write``, made on first use)."""

    def __init__(
        self, layout: KVLayout, batch: int, ctx: int, shape: ChunkShape, count: int, device: Device
    ):
        c = shape.chunk
        self.shape = shape
        self.ids = np.zeros((batch, c), np.int64)
        self.position_ids = np.zeros((batch, c), np.int64)
        self.cache_position = np.zeros((batch, c), np.int64)
        self.mask = np.zeros((batch, shape.mask_width(ctx)), np.int64)
        self.cols = np.arange(c, dtype=np.int64)
        self.new: list[np.ndarray] = []
        self.new_values: list[ort.OrtValue] = []
        if device.host:
            self.new = [np.zeros(layout.shape(batch, c), layout.dtype) for _ in range(count)]
        else:
            self.new_values = device.zeros(layout.shape(batch, c), layout.dtype, count)
        self.write: tuple[ort.InferenceSession, ort.IOBinding] | None = None


class _FixedShapeCache(PreallocatedBuffers, KVCacheBase):
    kind: ClassVar[str]
    uses_positions: ClassVar[bool] = True
    on_device: ClassVar[bool] = True  # written by a small graph where the buffers are
    left_padded: ClassVar[bool]  # where padding goes inside a chunk
    _facts_name: ClassVar[str]  # the write graph's per-row input on a device
    cannot_copy: ClassVar[str] = (
        "the fixed-chunk pass writes its rows and keeps each row's count of valid slots; "
        "copying rows in past that bookkeeping is not built"
    )

    def __init__(
        self,
        layout: KVLayout,
        batch_size: int,
        max_length: int,
        positions: PositionState,
        device: Device = HOST,
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
        self._device = device
        self._allocate([shape] * len(self._names), layout.dtype)  # the rows are written here
        self.rows = np.zeros(batch_size, np.int64)  # real tokens per row in the current chunk
        # On a device: the per-row counts the write graph reads, staged there once.
        self._facts = np.zeros(self._facts_shape(batch_size), np.int64)
        self._staged = None if device.host else StagedArray(device, self._facts)
        self._shapes: dict[ChunkShape, _ChunkBuffers] = {}
        self._use(ChunkShape(self.chunk))
        self._bound: set[int] = set()

    def _use(self, shape: ChunkShape) -> _ChunkBuffers:
        """Make ``shape``'s buffers the current ones (``ids``, ``mask``... are read from here)."""
        buf = self._shapes.get(shape)
        if buf is None:
            count = len(self._names)
            buf = _ChunkBuffers(
                self.layout, self._batch, self._capacity, shape, count, self._device
            )
            self._shapes[shape] = buf
            if not self._device.host:
                self._bind_write(buf)  # refused here, before a pass, if it cannot run
        self._cur = buf
        self.ids, self.position_ids = buf.ids, buf.position_ids
        self.cache_position, self.mask, self._new = buf.cache_position, buf.mask, buf.new
        return buf

    # -- one chunk ---------------------------------------------------------------------------

    def check_room(self, counts: np.ndarray, shape: ChunkShape | None = None) -> None:
        """Refuse a pass that cannot fit, before anything is written."""

    def fill(self, tokens: list[np.ndarray], shape: ChunkShape | None = None) -> None:
        """Lay out one chunk: ``tokens[b]`` are row b's real tokens in it (at most ``C``), for a
        graph taking chunks of ``shape`` (default: the layout's, attending over past + chunk)."""
        buf = self._use(shape or ChunkShape(self.chunk))
        c, ctx = buf.shape.chunk, self._capacity
        buf.ids[...] = 0
        buf.position_ids[...] = 0
        buf.mask[...] = 0
        for b, row in enumerate(tokens):
            k = len(row)
            self.rows[b] = k
            cols = slice(c - k, c) if self.left_padded else slice(0, k)
            buf.ids[b, cols] = row
            np.add(self.valid[b], buf.cols[:k], out=buf.position_ids[b, cols])
            buf.mask[b, self._chunk_start(b, buf.shape) :][cols] = 1
            self._mask_past(b, buf)
        # Slots the new rows take (pads continue counting, clipped to the context).
        np.add(self.valid[:, None], buf.cols[None, :], out=buf.cache_position)
        np.minimum(buf.cache_position, ctx - 1, out=buf.cache_position)

    def last_column(self, b: int) -> int:
        """The chunk column of row b's last real token."""
        return self._cur.shape.chunk - 1 if self.left_padded else int(self.rows[b]) - 1

    def bind(self, stage: BoundSession, num_new: int) -> None:
        if id(stage) in self._bound:  # a stage always runs one chunk shape: bound once
            return
        for i, ((past, present), value) in enumerate(zip(self._names, self._values)):
            stage.bind_value(past, value)
            if self._device.host:
                stage.bind_output_array(present, self._new[i])
            else:
                stage.bind_output_value(present, self._cur.new_values[i])
        self._bound.add(id(stage))

    def commit(self) -> None:
        """Write the real rows of the chunk just run into the cache."""
        if not self._device.host:
            self._write_on_device(self._cur, self._chunk_facts())
        else:
            for array, new in zip(self._arrays, self._new):
                for b in range(self._batch):
                    k = int(self.rows[b])
                    if k:
                        self._write(array[b], new[b], int(self.valid[b]), k)
        self.valid += self.rows

    def _write_on_device(self, buf: _ChunkBuffers, facts: np.ndarray) -> None:
        """Run ``buf``'s write graph on the device with ``facts`` (its binding made once)."""
        self._staged.sync(facts)
        session, binding = buf.write or self._bind_write(buf)
        census.run(session.run_with_iobinding, binding)

    def _bind_write(self, buf: _ChunkBuffers) -> tuple[ort.InferenceSession, ort.IOBinding]:
        session = self._write_session(buf.shape.chunk)
        binding = session.io_binding()
        for i, (value, new) in enumerate(zip(self._values, buf.new_values)):
            binding.bind_ortvalue_input(f"past{i}", value)
            binding.bind_ortvalue_input(f"new{i}", new)
            binding.bind_ortvalue_output(f"out{i}", value)  # the same tensor: in place
        binding.bind_ortvalue_input(self._facts_name, self._staged.value)
        buf.write = (session, binding)
        return buf.write

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
        # Whole contexts (where rows sit depends on the kind); on a device gathered there into
        # new tensors, which every stage and write graph binds again.
        if self._move_rows(rows):
            self._bound.clear()
            for buf in self._shapes.values():
                buf.write = None
        self.valid[:] = self.valid[rows]

    @property
    def _data_type(self) -> str:
        return self._values[0].data_type()

    def _facts_shape(self, batch: int) -> tuple[int, ...]:
        raise NotImplementedError

    def _chunk_facts(self) -> np.ndarray:
        """What the device write graph reads about the chunk just run."""
        raise NotImplementedError

    def _write_session(self, chunk: int) -> ort.InferenceSession:
        raise NotImplementedError

    def _chunk_start(self, b: int, shape: ChunkShape) -> int:
        """The mask column of the chunk's first column."""
        raise NotImplementedError

    def _mask_past(self, b: int, buf: _ChunkBuffers) -> None:
        raise NotImplementedError

    def _write(self, rows: np.ndarray, new: np.ndarray, valid: int, k: int) -> None:
        raise NotImplementedError

    def _rewind_rows(self, target: np.ndarray) -> None:
        raise NotImplementedError


class StaticIndexCopyCache(_FixedShapeCache):
    kind: ClassVar[str] = "static-index-copy"
    left_padded: ClassVar[bool] = False
    _facts_name: ClassVar[str] = "rows"

    def check_room(self, counts: np.ndarray, shape: ChunkShape | None = None) -> None:
        worst = int(np.argmax(self.valid + counts))
        if self.valid[worst] + counts[worst] > self._capacity:
            raise GenerationError(
                f"{self.layout.file}: {int(counts[worst])} new tokens after "
                f"{int(self.valid[worst])} (row {worst}) exceed the graph's fixed context of "
                f"{self._capacity} positions"
            )
        if shape is None or not shape.in_graph:
            return
        # The graph index-copies every column of a chunk, pads too: the last chunk must fit.
        c = shape.chunk
        chunks = -(-max(int(counts.max()), 1) // c)
        need = self.valid + np.minimum(counts, (chunks - 1) * c) + c
        worst = int(np.argmax(need))
        if need[worst] > self._capacity:
            raise GenerationError(
                f"{self.layout.file}: the graph writes whole chunks of {c} slots at "
                f"cache_position, pads included; {int(counts[worst])} new tokens after "
                f"{int(self.valid[worst])} (row {worst}) end in a chunk reaching slot "
                f"{int(need[worst])}, past the fixed context of {self._capacity}"
            )

    def _chunk_start(self, b: int, shape: ChunkShape) -> int:
        return int(self.valid[b]) if shape.in_graph else self._capacity

    def _mask_past(self, b: int, buf: _ChunkBuffers) -> None:
        buf.mask[b, : self.valid[b]] = 1

    def _write(self, rows: np.ndarray, new: np.ndarray, valid: int, k: int) -> None:
        rows[:, valid : valid + k] = new[:, :k]

    def _rewind_rows(self, target: np.ndarray) -> None:
        pass  # slots past a row's valid count are masked and overwritten when reached

    def _facts_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, 2)

    def _chunk_facts(self) -> np.ndarray:
        self._facts[:, 0] = self.valid  # each row's first slot, and how many it writes
        self._facts[:, 1] = self.rows
        return self._facts

    def _write_session(self, chunk: int) -> ort.InferenceSession:
        if chunk > self._capacity:  # the graph's pad columns need a slot of their own
            raise ModelError(
                f"{self.layout.file}: a chunk of {chunk} new rows is wider than the fixed "
                f"context of {self._capacity}; a {self.kind} cache on {self._device} needs "
                "it to fit"
            )
        return write_rows_session(self._device, self._data_type, len(self._names), chunk)


class StaticFifoCache(_FixedShapeCache):
    kind: ClassVar[str] = "static-fifo"
    # The FIFO drops its oldest rows: a rewind past them fails, so no speculation.
    can_rewind: ClassVar[bool] = False
    left_padded: ClassVar[bool] = True
    _facts_name: ClassVar[str] = "shift"
    cannot_copy: ClassVar[str] = (
        "the FIFO slides its rows left on every pass (the newest at the last slot), so a "
        "position does not sit at a slot of its own"
    )

    @property
    def evicted(self) -> bool:
        return bool((self.valid > self._capacity).any())

    def _chunk_start(self, b: int, shape: ChunkShape) -> int:
        return self._capacity - shape.chunk if shape.in_graph else self._capacity

    def _mask_past(self, b: int, buf: _ChunkBuffers) -> None:
        # In the graph, the chunk takes the last C slots: the held rows end before it, and the
        # oldest fall out of this pass's view (the cache still holds them for the next pass).
        end = self._chunk_start(b, buf.shape)
        held = min(int(self.valid[b]), end)
        buf.mask[b, end - held : end] = 1

    def _write(self, rows: np.ndarray, new: np.ndarray, valid: int, k: int) -> None:
        ctx, c = self._capacity, self._cur.shape.chunk
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
        if not self._device.host:  # on the device: a slide right by the rows dropped
            np.minimum(target - self.valid, 0, out=self._facts)
            self._write_on_device(self._cur, self._facts)

    def _facts_shape(self, batch: int) -> tuple[int, ...]:
        return (batch,)

    def _chunk_facts(self) -> np.ndarray:
        self._facts[:] = self.rows  # each row slides left by the rows it adds
        return self._facts

    def _write_session(self, chunk: int) -> ort.InferenceSession:
        return slide_rows_session(
            self._device, self._data_type, len(self._names), self._capacity, chunk
        )
