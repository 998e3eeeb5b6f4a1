"""Static-scatter cache: per layer, fixed ``[B, max_seq_len, kv_hidden]`` key and value buffers
that the graph updates in place (TensorScatter at ``write_indices``) and reads with
``nonpad_kv_seqlen`` (Attention-24). One OrtValue is bound as both past and present, so a step
copies nothing; the runtime only feeds the two per-row driver vectors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ..errors import GenerationError, ModelError
from ..session.bound import BoundSession
from ..session.device import HOST, Device
from .base import KVCacheBase, KVLayout, PreallocatedBuffers, bind_in_place, host_obstacle

if TYPE_CHECKING:
    from ..session.positions import PositionState


class RowDrivers:
    """``write_indices`` (valid tokens per row before a pass) and ``nonpad_kv_seqlen`` (rows
    written by the end of it): two int64 ``[B]`` buffers bound by pointer once, refilled in place.

    A right-padded prompt row counts its pad columns on the prompt pass: graphs with
    ``is_causal`` align queries to the end of ``nonpad_kv_seqlen``, and the pads, sitting after
    the real tokens, are never visible to them. The next pass writes over them at the real length.
    """

    def __init__(self, layout: KVLayout, batch_size: int, positions: PositionState):
        self.names = dict(layout.drivers)
        self.before = np.zeros(batch_size, np.int64)
        self.after = np.zeros(batch_size, np.int64)
        self._positions = positions

    def update(self, num_new: int) -> None:
        self._positions.rows_before(num_new, self.before)
        np.add(self.before, num_new, out=self.after)

    def bind(self, stage: BoundSession) -> None:
        for role, array in (("write_indices", self.before), ("nonpad_kv_seqlen", self.after)):
            if role in self.names:
                stage.feed(self.names[role], array)


class StaticScatterCache(PreallocatedBuffers, KVCacheBase):
    kind: ClassVar[str] = "static-scatter"
    formats: ClassVar[tuple[str, ...]] = ("scatter",)
    uses_positions: ClassVar[bool] = True
    on_device: ClassVar[bool] = True  # the graph writes its buffers; only drivers are fed
    # On the host: row p of a batch entry is position p, its kv_hidden split into heads.
    can_copy_rows: ClassVar[bool] = True

    def __init__(
        self,
        layout: KVLayout,
        batch_size: int,
        max_length: int,
        positions: PositionState,
        device: Device = HOST,
    ):
        if layout.format != "scatter" or not layout.static_capacity:
            raise ModelError(
                f"{layout.file}: static-scatter needs fixed [batch, max_seq_len, kv_hidden] caches"
            )
        missing = {"write_indices", "nonpad_kv_seqlen"} - set(dict(layout.drivers))
        if missing:
            raise ModelError(
                f"{layout.file}: a static-scatter graph needs int64 [batch] inputs "
                f"{', '.join(sorted(missing))} (name them in decoder.inputs or "
                "pipeline.state.kv_cache)"
            )
        self.layout = layout
        self.length = 0
        self._batch = batch_size
        self._capacity = layout.static_capacity
        self._drivers = RowDrivers(layout, batch_size, positions)
        self._device = device
        shapes = [(batch_size, self._capacity, hidden) for hidden in layout.hidden_sizes]
        self._allocate(shapes, layout.dtype)
        self._epoch = id(self._values[0])  # a binding made for other buffers must be redone

    def bind(self, stage: BoundSession, num_new: int) -> None:
        self._drivers.update(num_new)
        # The graph writes num_new rows per sequence at its write index, padding included.
        end = int(self._drivers.before.max()) + num_new
        if end > self._capacity:
            raise GenerationError(
                f"{self.layout.file}: {num_new} new tokens after {end - num_new} would write past "
                f"the static KV cache's max_seq_len {self._capacity}"
            )
        self._drivers.bind(stage)  # refilled in place: rebound only where a device copies them
        if stage.kv_epoch == self._epoch:
            return  # same buffers
        names = [n for pair in zip(self.layout.past, self.layout.present) for n in zip(*pair)]
        bind_in_place(stage, names, self._values)
        stage.kv_epoch = self._epoch

    def advance(self, stage: BoundSession, num_new: int) -> None:
        self.length += num_new

    def rewind_to(self, length: int) -> None:
        # Rows past nonpad_kv_seqlen are never read and the next pass overwrites them.
        self.length = min(self.length, length)

    def reorder(self, rows: np.ndarray) -> None:
        if self._move_rows(rows, (slice(0, self.length),)):
            self._epoch = id(self._values[0])

    def buffers(self) -> list[np.ndarray]:
        """The key/value arrays the graph writes in place, in ``layout.past`` order (host)."""
        return self._arrays

    @property
    def copy_obstacle(self) -> str | None:
        layout = self.layout
        width = layout.num_kv_heads * layout.head_size
        if any(hidden != width for hidden in layout.hidden_sizes):
            return (
                f"a {self.kind} cache whose tensors' kv_hidden {list(layout.hidden_sizes)} are "
                f"not {layout.num_kv_heads} heads x {layout.head_size} cannot copy rows by head"
            )
        return host_obstacle(self.kind, self._device)

    def _read(self, start: int, end: int) -> np.ndarray:
        _, (_, heads, size) = self.row_shape
        n = end - start
        return np.stack(
            [a[0, start:end].reshape(n, heads, size).transpose(1, 0, 2) for a in self._arrays]
        )

    def _write(self, start: int, rows: np.ndarray) -> None:
        n = rows.shape[2]
        if start + n > self._capacity:
            raise GenerationError(
                f"{self.layout.file}: {start + n} positions exceed the static KV cache's "
                f"max_seq_len {self._capacity}"
            )
        for array, part in zip(self._arrays, rows):
            array[0, start : start + n] = part.transpose(1, 0, 2).reshape(n, -1)
