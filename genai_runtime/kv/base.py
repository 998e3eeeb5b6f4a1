"""The KVCache protocol and the layout facts a cache is built from."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol

import numpy as np
import onnxruntime as ort

from ..errors import GenerationError, UnsupportedError
from ..session.device import HOST, Device

if TYPE_CHECKING:
    from onnxruntime import OrtValue

    from ..session.bound import BoundSession


@dataclass(frozen=True)
class KVLayout:
    """What the decoder graph declares about its self-attention cache.

    ``past`` / ``present`` hold, per layer, the tensor names: ``(key, value)`` for separate
    caches, ``(kv,)`` for the combined gpt2 layout ``[2, B, H, S, D]``.
    """

    format: Literal["separate", "combined", "scatter"]
    past: tuple[tuple[str, ...], ...]
    present: tuple[tuple[str, ...], ...]
    dtype: np.dtype
    num_kv_heads: int
    head_size: int
    pattern: str  # the past-key name pattern that matched, for messages
    file: str
    static_capacity: int | None = None  # scatter caches: the graph's fixed max sequence
    static_batch: int | None = None  # a batch size the graph fixes in its KV inputs
    # scatter caches: each past tensor's own kv_hidden, in ``past`` order (may differ per layer)
    hidden_sizes: tuple[int, ...] = ()
    # cache driver inputs the graph declares, role -> tensor name (write_indices, ...)
    drivers: tuple[tuple[str, str], ...] = ()
    window: int | None = None  # sliding-window size the graph's local layers attend over
    window_layers: tuple[int, ...] = ()  # the windowed layers; empty: all of them
    window_slack: int = 0  # rows a windowed cache keeps beyond the window (0: default)
    # fixed-shape graphs: past fixed at static_capacity, present holds only this many new rows
    new_rows: int | None = None
    cache_position: str | None = None  # the graph's cache_position input, if it takes one

    @property
    def num_layers(self) -> int:
        return len(self.past)

    def driver(self, role: str) -> str | None:
        return dict(self.drivers).get(role)

    @property
    def seq_axis(self) -> int:
        return {"separate": 2, "combined": 3, "scatter": 1}[self.format]

    @property
    def batch_axis(self) -> int:
        return 1 if self.format == "combined" else 0

    def shape(self, batch: int, seq: int) -> tuple[int, ...]:
        h, d = self.num_kv_heads, self.head_size
        if self.format == "combined":
            return (2, batch, h, seq, d)
        if self.format == "scatter":
            return (batch, seq, h * d)
        return (batch, h, seq, d)

    def bytes_per_token(self, batch: int) -> int:
        if self.hidden_sizes:
            return batch * sum(self.hidden_sizes) * self.dtype.itemsize
        per_tensor = batch * self.num_kv_heads * self.head_size * self.dtype.itemsize
        names = sum(len(p) for p in self.past)
        return per_tensor * names * (2 if self.format == "combined" else 1)


def bind_in_place(
    stage: BoundSession, names: Iterable[tuple[str, str]], values: Sequence[OrtValue]
) -> None:
    """Bind each buffer as both its past input and its present output: the graph writes into it
    in place, so nothing is copied per step."""
    for (past, present), value in zip(names, values):
        stage.bind_value(past, value)
        stage.bind_output_value(present, value)


def move_rows(
    arrays: Sequence[np.ndarray], rows: np.ndarray, batch_axis: int, index: tuple = ()
) -> None:
    """In place, batch row i of each array takes old row ``rows[i]`` (``index`` narrows the
    axes after the batch axis, e.g. to the positions written); rows that stay are not copied."""
    moved = np.flatnonzero(rows != np.arange(rows.size))
    if moved.size == 0:
        return
    lead = (slice(None),) * batch_axis
    target, source = (*lead, moved, *index), (*lead, rows[moved], *index)
    for array in arrays:
        array[target] = array[source]  # the fancy-indexed read is a copy: overlaps are safe


def host_obstacle(kind: str, device: Device) -> str | None:
    """Why a ``kind`` cache on ``device`` cannot copy rows (None on the host)."""
    if device.host:
        return None
    return f"a {kind} cache on {device} keeps its keys/values there; rows are copied on the host"


def read_positions(arrays: Sequence[np.ndarray], start: int, end: int) -> np.ndarray:
    """Positions ``start:end`` of batch row 0 of ``[B, H, S, D]`` arrays, stacked (a copy)."""
    return np.stack([array[0, :, start:end] for array in arrays])


def write_positions(arrays: Sequence[np.ndarray], start: int, rows: np.ndarray) -> None:
    """``rows`` (``[tensors, H, n, D]``) into positions ``start...`` of batch row 0."""
    end = start + rows.shape[2]
    for array, part in zip(arrays, rows):
        array[0, :, start:end] = part


def check_rows(
    rows: np.ndarray, row_shape: tuple[np.dtype, tuple[int, int, int]], what: str
) -> None:
    """``rows`` are ``[tensors, heads, positions, head size]`` of ``row_shape``'s dtype and
    sizes (what ``read_rows`` gives); else a GenerationError naming ``what`` they are for."""
    dtype, (tensors, heads, size) = row_shape
    if rows.dtype != dtype or rows.ndim != 4 or rows.shape[:2] != (tensors, heads) or (
            rows.shape[3] != size):  # fmt: skip
        raise GenerationError(
            f"rows {rows.dtype}{list(rows.shape)} do not fit {what} "
            f"{dtype}[{tensors}, {heads}, positions, {size}]"
        )


class PreallocatedBuffers:
    """For caches that allocate their whole buffers up front: a fixed capacity, and every
    buffer's bytes held from the start. On the host the buffers are NumPy arrays (``_arrays``)
    wrapped as OrtValues; on a device (``_device``) they are zero-filled device tensors made
    there, ``_arrays`` is empty, and rows move by a gather graph on the device."""

    _capacity: int
    _arrays: list[np.ndarray]
    _values: list[OrtValue]
    _nbytes: int = 0
    _device: Device = HOST

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def _allocate(self, shapes: Sequence[tuple[int, ...]], dtype: np.dtype) -> None:
        """One zeroed buffer per shape, where ``_device`` reads it."""
        if self._device.host:
            self._arrays = [np.zeros(shape, dtype) for shape in shapes]
            self._values = [ort.OrtValue.ortvalue_from_numpy(a) for a in self._arrays]
        else:
            self._arrays = []
            self._values = [self._device.zeros(shape, dtype, 1)[0] for shape in shapes]
        itemsize = np.dtype(dtype).itemsize
        self._nbytes = sum(int(np.prod(shape)) * itemsize for shape in shapes)

    def _move_rows(self, rows: np.ndarray, index: tuple = ()) -> bool:
        """Batch row i takes old row ``rows[i]``: in place on the host (``index`` narrows the
        axes after the batch axis); on a device each buffer is replaced by its gathered rows
        (new tensors: True, so the caller binds them)."""
        if self._device.host:
            move_rows(self._arrays, rows, 0, index)
            return False
        if (rows == np.arange(rows.size)).all():
            return False
        self._values = self._device.take_many(self._values, rows, axis=0)
        return True


class KVCache(Protocol):
    """One cache layout. ``length`` counts tokens whose keys/values the cache holds.

    What a kind can do is declared (``KVCacheBase`` holds the defaults), never probed: the
    planner, the executor, speculation and ``explain`` read these and nothing else.
    """

    kind: ClassVar[str]
    formats: ClassVar[tuple[str, ...]]  # the layouts (``KVLayout.format``) the kind holds
    on_device: ClassVar[bool]  # keeps its buffers on the session's device
    uses_positions: ClassVar[bool]  # built from the row positions (scatter-style writes)
    static_mask: ClassVar[bool]  # on a device, captured decode may feed the [B, max_length] mask
    can_rewind: ClassVar[bool]  # rewind_to any length it held (no eviction): speculation
    can_compact: ClassVar[bool]  # compact (keep one path of a token tree)
    can_copy_rows: ClassVar[bool]  # read_rows / write_rows (prompt caches); see cannot_copy
    cannot_copy: ClassVar[str]  # why a kind that declares can_copy_rows False cannot
    chunk: int | None  # a fixed-shape kind: the tokens each pass takes; None otherwise
    layout: KVLayout
    length: int

    @property
    def capacity(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    def bind(self, stage: BoundSession, num_new: int) -> None:
        """Put past (and present) tensors in place for a pass over ``num_new`` tokens."""

    def advance(self, stage: BoundSession, num_new: int) -> None:
        """Account for what ``stage`` just wrote for ``num_new`` tokens."""

    def rewind_to(self, length: int) -> None:
        """Forget everything past ``length`` tokens."""

    def reorder(self, rows: np.ndarray) -> None:
        """Batch row i takes old row ``rows[i]`` (beam search). Rows move only among rows with
        the same positions (one prompt's beams)."""

    def compact(self, start: int, keep: np.ndarray) -> None:
        """Keep the positions before ``start`` and those at ``keep`` (in order), moved to
        consecutive positions (token trees); only kinds that declare ``can_compact``."""

    @property
    def copy_obstacle(self) -> str | None:
        """Why ``read_rows`` / ``write_rows`` cannot run on this cache (None: they can)."""

    @property
    def row_shape(self) -> tuple[np.dtype, tuple[int, int, int]]:
        """The dtype and ``(tensors, heads, head size)`` of one position's rows."""

    def read_rows(self, start: int, end: int) -> np.ndarray:
        """A copy of positions ``start:end`` of batch row 0, every KV tensor stacked:
        ``[tensors, heads, end - start, head size]``; only kinds that declare ``can_copy_rows``."""

    def write_rows(self, start: int, rows: np.ndarray) -> None:
        """Put ``rows`` (as ``read_rows`` returns them) at positions ``start...`` of batch row 0,
        which then holds ``start + rows.shape[2]`` tokens (it must hold ``start`` already)."""


class KVCacheBase:
    """The capability defaults of ``KVCache``: the least a kind can do. A kind subclasses this
    and declares what it adds."""

    kind: ClassVar[str]
    formats: ClassVar[tuple[str, ...]] = ("separate",)
    on_device: ClassVar[bool] = False
    uses_positions: ClassVar[bool] = False
    static_mask: ClassVar[bool] = False
    can_rewind: ClassVar[bool] = True
    can_compact: ClassVar[bool] = False
    can_copy_rows: ClassVar[bool] = False
    cannot_copy: ClassVar[str] = "copying its rows out and in is not built"
    copies_from_device: ClassVar[bool] = False  # rows on a device are copied through the host
    chunk: int | None = None
    layout: KVLayout
    length: int

    def compact(self, start: int, keep: np.ndarray) -> None:
        raise UnsupportedError(f"a {self.kind} cache cannot keep one path of a token tree")

    @property
    def copy_obstacle(self) -> str | None:
        if not self.can_copy_rows:
            return f"a {self.kind} cache cannot copy its keys/values: {self.cannot_copy}"
        return None

    @property
    def row_shape(self) -> tuple[np.dtype, tuple[int, int, int]]:
        layout = self.layout
        tensors = sum(len(p) for p in layout.past) * (2 if layout.format == "combined" else 1)
        return np.dtype(layout.dtype), (tensors, layout.num_kv_heads, layout.head_size)

    def read_rows(self, start: int, end: int) -> np.ndarray:
        self._check_copy()
        if not 0 <= start <= end <= self.length:
            raise GenerationError(
                f"positions {start}:{end} are not held by a {self.kind} cache of {self.length}"
            )
        if start == end:
            dtype, (tensors, heads, size) = self.row_shape
            return np.zeros((tensors, heads, 0, size), dtype)
        return self._read(start, end)

    def write_rows(self, start: int, rows: np.ndarray) -> None:
        self._check_copy()
        check_rows(rows, self.row_shape, f"a {self.kind} cache of")
        if not 0 <= start <= self.length:
            raise GenerationError(f"a {self.kind} cache holds {self.length} tokens, not {start}")
        self._write(start, rows)
        self.length = start + rows.shape[2]

    def _check_copy(self) -> None:
        why = self.copy_obstacle
        if why is not None:
            raise UnsupportedError(why)

    def _read(self, start: int, end: int) -> np.ndarray:
        raise UnsupportedError(self.copy_obstacle or "not built")

    def _write(self, start: int, rows: np.ndarray) -> None:
        raise UnsupportedError(self.copy_obstacle or "not built")
