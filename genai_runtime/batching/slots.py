"""Where the engines' sequences live while they decode: numbered slots over the model.

``InterleavedSlots`` gives each slot its own batch-1 executor and runs one slot at a time;
``BatchedSlots`` makes each slot a row of one batched share-buffer cache, prefills a sequence
into its row through a batch-1 view of that row, and runs the listed rows' next tokens in one
onnxruntime call. Both return float32 logits; tokens are picked the same way for both.

A slot keeps its cache after its request ends, so a later prompt that starts with the same
tokens (a system prompt, a chat that goes on) reuses that prefix instead of prefilling it again.
Slots that can copy a row's keys/values out and in (``copy_obstacle`` is None) also serve the
server's prompt cache (``batching.prompt_cache``), which outlives any one slot's contents.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..adapters import Adapters
from ..errors import ModelError, UnsupportedError
from ..model import Model
from ..runtime.adapters import bind_adapter
from ..runtime.executor import Executor
from ..runtime.sessions import run_options
from ..runtime.verify_rows import verify_session
from ..session.bound import BoundSession
from ..session.device import Device
from ..session.graph_io import LAST_POSITION_SWITCH, SessionIO, takes_last_position_switch

GROWTH_TOKENS = 256
_LAST_ONLY = np.array(True)  # bound once to the prefill binding, never written


class InterleavedSlots:
    """One batch-1 executor per slot; a decode step runs the slots one after another.

    With LoRA ``adapters``, a slot's executor has the adapter of the request it serves bound;
    a request with another adapter (or none) gets a fresh executor, as tensors stay bound."""

    kind = "interleaved"

    def __init__(
        self,
        model: Model,
        num_slots: int,
        max_length: int,
        adapters: Adapters | None = None,
        *,
        min_rows: int = 2,
    ):
        self.num_slots = num_slots
        self.max_length = max_length
        self._pipeline = model.pipeline
        self._adapters = adapters
        self._slots: list[Executor | None] = [None] * num_slots
        self._slot_adapter: list[str | None] = [None] * num_slots
        # Rows are copied through each slot's executor when its cache kind can (the prompt
        # cache's; requests with an adapter never use it): slot 0's, made now, says.
        self.copy_obstacle: str | None = self._executor(0, None).copy_obstacle

    def _executor(self, slot: int, adapter: str | None) -> Executor:
        ex = self._slots[slot]
        if ex is None or adapter != self._slot_adapter[slot]:
            self._slots[slot] = None  # the old cache goes before the new one is allocated
            ex = self._pipeline.executor(1, self.max_length)
            if adapter is not None:
                bind_adapter(ex, self._adapters.acquire(adapter, self))
            self._slots[slot], self._slot_adapter[slot] = ex, adapter
        return ex

    def prefill(
        self, slot: int, tokens: np.ndarray, start: int, adapter: str | None = None
    ) -> np.ndarray:
        """Keep the slot's first ``start`` tokens, run ``tokens`` after them; logits [V]."""
        ex = self._executor(slot, adapter)
        ex.rewind_to(start)
        try:
            return ex.forward(tokens.reshape(1, -1).astype(np.int32))[0].copy()
        except Exception:
            ex.rewind_to(0)
            raise

    def decode(self, slots: list[int], tokens: np.ndarray, rows: range | None = None) -> np.ndarray:
        """One token per listed slot; logits [len(slots), V]. ``rows`` is ignored: every slot
        runs alone."""
        out = None
        for i, slot in enumerate(slots):
            ex = self._executor(slot, self._slot_adapter[slot])
            logits = ex.forward(tokens[i : i + 1, None])
            if out is None:
                out = np.empty((len(slots), logits.shape[-1]), np.float32)
            out[i] = logits[0]
        return out

    def rewind(self, slot: int, length: int) -> None:
        """Keep only the slot's first ``length`` tokens."""
        if self._slots[slot] is not None:
            self._slots[slot].rewind_to(length)

    def release(self, slot: int) -> None:
        """Nothing to free: the executor (and its cache) stays for prefix reuse."""

    @property
    def row_shape(self) -> tuple[np.dtype, tuple[int, int, int]]:
        """As ``BatchedSlots.row_shape``: one position's keys/values."""
        return self._executor(0, self._slot_adapter[0]).kv_rows

    def read_rows(self, slot: int, start: int, end: int) -> np.ndarray:
        """Positions ``start:end`` of the slot's keys/values, as ``BatchedSlots.read_rows``."""
        ex = self._slots[slot]
        if ex is None:
            raise ModelError(f"slot {slot} holds no tokens")
        return ex.read_kv(start, end)

    def write_rows(self, slot: int, start: int, rows: np.ndarray) -> None:
        """Put ``rows`` at positions ``start...`` of the slot (a request without an adapter)."""
        self._executor(slot, None).write_kv(start, rows)


class BatchedSlots:
    """Rows of one batched share-buffer cache ``[rows, H, capacity, D]`` per KV tensor.

    Needs the plain decoder shape: one stage whose only runtime inputs are input_ids,
    attention_mask and (optionally) position_ids, with a share-buffer (GroupQueryAttention)
    cache that writes each row's new key/value at that row's own length (``seqlens_k`` from the
    attention mask), so rows of different lengths decode together. ``supports`` says whether a
    model has that shape; the engine falls back to ``InterleavedSlots`` otherwise. On a device
    the buffers are device tensors whose rows are bound by address, and the decode mask spans
    the whole buffer, so a step allocates nothing there.
    """

    kind = "batched"

    @staticmethod
    def supports(model: Model) -> str | None:
        """None if batched decode works for this model, else why not."""
        plan = model.plan
        if len(plan.stages) != 1:
            return f"{len(plan.stages)} stages (batched decode needs one decoder stage)"
        stage = plan.stages[0]
        kv = model.pipeline.kv_plan()
        if kv is None or kv.kind != "share-buffer":
            return "the KV cache is not a share-buffer cache"
        roles = {f.role for f in stage.feeds_from("role")}
        if not roles <= {"input_ids", "attention_mask", "position_ids"}:
            return f"the decoder takes runtime inputs {sorted(roles)}"
        if "attention_mask" not in roles or stage.feeds_from("wire") or stage.feeds_from("user"):
            return "the decoder needs wired or user inputs, or has no attention_mask"
        if stage.logits is None or plan.vocab_size is None:
            return "the decoder's logits or vocabulary size are unknown"
        return None

    def __init__(
        self,
        model: Model,
        num_slots: int,
        max_length: int,
        *,
        min_rows: int = 2,
        verify: bool = False,
    ):
        """``verify``: also load the per-row verify session (``runtime.verify_rows``: a second
        copy of the weights) so ``verify`` can score drafted tokens."""
        why = self.supports(model)
        if why is not None:
            raise ModelError(f"batched decode is not available: {why}")
        plan = model.plan
        stage = plan.stages[0]
        self.num_slots = num_slots
        self.max_length = max_length
        self._layout = plan.layout
        self._vocab = plan.vocab_size
        self._logits_name = stage.logits.name
        self._logits_rank = stage.logits.rank
        self._logits_dtype = stage.logits.dtype
        feeds = {f.role: f for f in stage.feeds_from("role")}
        self._ids_feed = feeds["input_ids"]
        self._mask_feed = feeds["attention_mask"]
        self._pos_feed = feeds.get("position_ids")
        session = model.sessions[stage.name]
        # On a device the rows' keys/values are device tensors, each batch's rows bound by
        # address; the host arrays below then hold only the per-step inputs.
        self._device = Device.of(session)
        # On the host the rows are NumPy arrays this class owns: copied out and in by slicing.
        self.copy_obstacle: str | None = None
        if not self._device.host:
            self.copy_obstacle = f"the keys/values live on {self._device}, not on the host"
        options = run_options(dict(stage.session.options.run_options))
        # Two bindings over the same session: a batch-1 prefill and the all-rows decode.
        self._prefill = BoundSession(stage.name, session, stage.io, options)
        self._decode = BoundSession(stage.name, session, stage.io, options)
        # A prefill reads its last position's logits only: a graph with the last-position
        # switch (session/graph_io.py) is asked for that row alone; the decode binding leaves
        # it at its default.
        self._last_only = takes_last_position_switch(session, stage.logits)
        if self._last_only:
            self._prefill.bind_array(LAST_POSITION_SWITCH, _LAST_ONLY)
        self._decode_rows = (0, 0)
        # Verification passes (several tokens per row) run a per-row rewrite of the graph,
        # bound per (rows, width); its buffers are kept per width.
        self._verify: BoundSession | None = None
        self._verify_rows = (0, 0, 0)
        self._wide: dict[int, tuple[np.ndarray, np.ndarray | None, np.ndarray, list]] = {}
        if verify and self._device.host and self._logits_rank == 3:
            model_dir = model.spec.model_dir or Path(".")
            session_spec = model.spec.sessions[stage.name]
            rows, _ = verify_session(session_spec, model_dir / session_spec.file, model_dir)
            self._verify = BoundSession(stage.name, rows, SessionIO.of(rows, session_spec.file,
                                        str(model_dir / session_spec.file)), options)  # fmt: skip
        # onnxruntime's int4 MatMulNBits kernels take another path (other rounding) for a single
        # row; from two rows on, each row's result is the same at any batch. The server never
        # runs fewer than two rows, so a request's tokens do not depend on whether it ran alone;
        # the 0.18 Engine API passes the rows of its batch, as the reference's static batch runs.
        self._min_rows = min(min_rows, num_slots)
        self._names = [
            (past, present)
            for pasts, presents in zip(self._layout.past, self._layout.present)
            for past, present in zip(pasts, presents)
        ]
        self._lengths = np.zeros(num_slots, np.int64)  # tokens held per row
        self._capacity = 0
        self._arrays: list[np.ndarray] = []  # on the host
        self._values: list[ort.OrtValue] = []  # on a device
        self._reserve(min(GROWTH_TOKENS, max_length))
        mask_dtype = self._mask_feed.info.dtype
        self._mask = np.zeros(num_slots * max_length, mask_dtype)  # [rows, total], contiguous
        self._ids = np.zeros((num_slots, 1), self._ids_feed.info.dtype)
        self._pos = np.zeros((num_slots, 1), self._pos_feed.info.dtype) if self._pos_feed else None
        self._logits = np.empty((num_slots, self._vocab), self._logits_dtype)
        if not self._device.host:
            shape = (num_slots, 1, self._vocab) if self._logits_rank == 3 else (
                num_slots, self._vocab)  # fmt: skip
            self._logits_value = self._device.empty(shape, self._logits_dtype)

    def _reserve(self, needed: int) -> None:
        if needed <= self._capacity:
            return
        if needed > self.max_length:
            raise ModelError(f"{needed} tokens exceed the server's context {self.max_length}")
        capacity = min(self.max_length, -(-needed // GROWTH_TOKENS) * GROWTH_TOKENS)
        shape = self._layout.shape(self.num_slots, capacity)
        self._decode_rows = (0, 0)  # the decode bindings must point at the new buffers
        self._verify_rows = (0, 0, 0)
        if not self._device.host:
            if self._values:  # positions held first; the rest is never read before written
                index = np.zeros(capacity, np.int64)
                index[: self._capacity] = np.arange(self._capacity)
                self._values = self._device.take_many(self._values, index, axis=2)
            else:
                self._values = self._device.zeros(shape, self._layout.dtype, len(self._names))
            self._capacity = capacity
            return
        arrays = []
        for i in range(len(self._names)):
            array = np.zeros(shape, self._layout.dtype)
            if self._arrays:
                array[:, :, : self._capacity] = self._arrays[i]
            arrays.append(array)
        self._arrays = arrays
        self._capacity = capacity

    def prefill(
        self, slot: int, tokens: np.ndarray, start: int, adapter: str | None = None
    ) -> np.ndarray:
        if adapter is not None:  # the engine interleaves requests when adapters are loaded
            raise ModelError("batched decode runs no LoRA adapter")
        n = int(tokens.size)
        self._reserve(start + n)
        self._lengths[slot] = start
        b = self._prefill
        ids = np.ascontiguousarray(tokens.reshape(1, n), self._ids_feed.info.dtype)
        mask = np.ones((1, start + n), self._mask_feed.info.dtype)
        b.bind_array(self._ids_feed.name, ids)
        b.bind_array(self._mask_feed.name, mask)
        if self._pos_feed is not None:
            pos = np.arange(start, start + n, dtype=self._pos_feed.info.dtype).reshape(1, n)
            b.bind_array(self._pos_feed.name, pos)
        if not self._device.host:
            self._bind_kv(b, slot, slot + 1)
            b.bind_output_alloc(self._logits_name)
            b.run()
            self._lengths[slot] = start + n
            logits = self._device.download(b.output(self._logits_name))
            last = logits[0, -1] if self._logits_rank == 3 else logits[0]
            return last.astype(np.float32)
        for (past, present), array in zip(self._names, self._arrays):
            row = array[slot : slot + 1]  # a contiguous [1, H, capacity, D] view of this row
            b.bind_array(past, row)
            b.bind_output_array(present, row)
        rows = 1 if self._last_only else n
        shape = (1, rows, self._vocab) if self._logits_rank == 3 else (1, self._vocab)
        logits = np.empty(shape, self._logits_dtype)
        b.bind_output_array(self._logits_name, logits)
        b.run()
        self._lengths[slot] = start + n
        last = logits[0, -1] if self._logits_rank == 3 else logits[0]
        return last.astype(np.float32)

    def decode(self, slots: list[int], tokens: np.ndarray, rows: range | None = None) -> np.ndarray:
        """The listed slots' next tokens in one call over the contiguous ``rows`` (default
        0..max(slots), at least ``min_rows``); rows not listed get a throwaway token written just
        past what they hold, so a kept prefix is never overwritten."""
        lo, hi = self._span(slots, rows)
        n = hi - lo
        self._reserve(int(self._lengths[lo:hi].max()) + 1)
        self._ids[lo:hi, 0] = 0
        self._ids[slots, 0] = tokens
        lengths = self._lengths[lo:hi]
        # On a device the mask spans the whole buffer (zeros past each row's length), so its
        # shape holds from step to step and its device tensor is updated in place.
        total = int(lengths.max()) + 1 if self._device.host else self._capacity
        mask = self._mask[: n * total].reshape(n, total)
        np.less_equal(np.arange(total)[None, :], lengths[:, None], out=mask, casting="unsafe")
        b = self._decode
        b.feed(self._ids_feed.name, self._ids[lo:hi])
        b.feed(self._mask_feed.name, mask)
        if self._pos_feed is not None:
            self._pos[lo:hi, 0] = lengths
            b.feed(self._pos_feed.name, self._pos[lo:hi])
        if not self._device.host:
            return self._decode_on_device(b, slots, lo, hi)
        if self._decode_rows != (lo, hi):
            for (past, present), array in zip(self._names, self._arrays):
                b.bind_array(past, array[lo:hi])
                b.bind_output_array(present, array[lo:hi])
            shape = (n, 1, self._vocab) if self._logits_rank == 3 else (n, self._vocab)
            b.bind_output_array(self._logits_name, self._logits[lo:hi].reshape(shape))
            self._decode_rows = (lo, hi)
        b.run()
        self._lengths[slots] += 1
        return self._logits[slots].astype(np.float32)

    def _span(self, slots: list[int], rows: range | None) -> tuple[int, int]:
        """The rows a pass runs: ``rows``, or 0..max(slots) and at least ``min_rows``."""
        if rows is None:
            rows = range(0, max(max(slots) + 1, self._min_rows))
        lo, hi = rows.start, rows.stop
        if not (0 <= lo <= min(slots) and max(slots) < hi <= self.num_slots):
            raise ModelError(f"pass rows {rows} do not cover slots {slots}")
        return lo, hi

    def verify_room(self, slots: list[int], rows: range | None = None) -> int:
        """The widest verify pass over ``slots`` (and ``rows``) that fits the context: every
        row of the pass, listed or not, is padded to its width."""
        lo, hi = self._span(slots, rows)
        return self.max_length - int(self._lengths[lo:hi].max())

    @property
    def verify_obstacle(self) -> str | None:
        """None when ``verify`` can score several tokens per row in one pass, else why not."""
        if not self._device.host:
            return f"verification passes run on the host; the keys/values live on {self._device}"
        if self._logits_rank != 3:
            return "the decoder's logits give the last position only"
        if self._verify is None:
            return "the slots were made without a verify session"
        return None

    def verify(
        self, slots: list[int], feeds: list[np.ndarray], rows: range | None = None
    ) -> list[np.ndarray]:
        """Several tokens per listed slot in one call over the contiguous ``rows`` (as
        ``decode``): slot ``slots[i]`` runs ``feeds[i]`` (one token or more) after what it
        holds. Every row is padded to the widest feed with throwaway tokens written past its
        own; unlisted rows run throwaway tokens only. Returns each slot's logits after each of
        its tokens, ``[len(feeds[i]), V]``; the slot then holds its whole feed (the caller
        rewinds what it rejects)."""
        obstacle = self.verify_obstacle
        if obstacle is not None:
            raise UnsupportedError(f"cannot verify drafts: {obstacle}")
        width = max(int(f.size) for f in feeds)
        lo, hi = self._span(slots, rows)
        n = hi - lo
        lengths = self._lengths[lo:hi]
        self._reserve(int(lengths.max()) + width)
        ids, pos, logits, new_rows = self._wide_buffers(width)
        ids[lo:hi] = 0
        for slot, feed in zip(slots, feeds):
            ids[slot, : feed.size] = feed
        total = int(lengths.max()) + width
        mask = self._mask[: n * total].reshape(n, total)
        np.less(np.arange(total)[None, :], lengths[:, None] + width, out=mask, casting="unsafe")
        b = self._verify
        b.feed(self._ids_feed.name, ids[lo:hi])
        b.feed(self._mask_feed.name, mask)
        if pos is not None:
            np.add(lengths[:, None], np.arange(width), out=pos[lo:hi], casting="unsafe")
            b.feed(self._pos_feed.name, pos[lo:hi])
        if self._verify_rows != (lo, hi, width):
            for (past, present), array, new in zip(self._names, self._arrays, new_rows):
                b.bind_array(past, array[lo:hi])
                b.bind_output_array(present, new[lo:hi])
            b.bind_output_array(self._logits_name, logits[lo:hi])
            self._verify_rows = (lo, hi, width)
        b.run()
        out = []
        for slot, feed in zip(slots, feeds):
            start, end = int(self._lengths[slot]), int(self._lengths[slot]) + feed.size
            for array, new in zip(self._arrays, new_rows):
                array[slot, :, start:end] = new[slot, :, : feed.size]
            self._lengths[slot] = end
            out.append(logits[slot, : feed.size].astype(np.float32))
        return out

    def _wide_buffers(self, width: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, list]:
        """Ids, positions, logits ``[slots, width(, V)]`` and each KV tensor's new rows
        ``[slots, heads, width, head size]`` for verification passes of ``width`` tokens, made
        once per width."""
        if width not in self._wide:
            rows = self.num_slots
            pos = None
            if self._pos_feed is not None:
                pos = np.zeros((rows, width), self._pos_feed.info.dtype)
            layout = self._layout
            shape = (rows, layout.num_kv_heads, width, layout.head_size)
            self._wide[width] = (
                np.zeros((rows, width), self._ids_feed.info.dtype),
                pos,
                np.empty((rows, width, self._vocab), self._logits_dtype),
                [np.empty(shape, layout.dtype) for _ in self._names],
            )
        return self._wide[width]

    def _decode_on_device(self, b: BoundSession, slots: list[int], lo: int, hi: int) -> np.ndarray:
        if self._decode_rows != (lo, hi):
            self._bind_kv(b, lo, hi)
            b.bind_rows(self._logits_name, self._logits_value, lo, hi, self._logits_dtype, True)
            self._decode_rows = (lo, hi)
        b.run()
        self._lengths[slots] += 1
        logits = self._device.download(self._logits_value).reshape(self.num_slots, self._vocab)
        return logits[slots].astype(np.float32)

    def _bind_kv(self, b: BoundSession, lo: int, hi: int) -> None:
        """Rows ``lo:hi`` of every device KV tensor, as past and present at once."""
        dtype = self._layout.dtype
        for (past, present), value in zip(self._names, self._values):
            b.bind_rows(past, value, lo, hi, dtype, False)
            b.bind_rows(present, value, lo, hi, dtype, True)

    def rewind(self, slot: int, length: int) -> None:
        """Keep only the row's first ``length`` tokens (later ones get overwritten)."""
        self._lengths[slot] = min(int(self._lengths[slot]), length)

    @property
    def row_shape(self) -> tuple[np.dtype, tuple[int, int, int]]:
        """The dtype and ``(tensors, heads, head size)`` of what ``read_rows`` returns per
        position: rows ``[tensors, heads, positions, head size]``."""
        layout = self._layout
        return np.dtype(layout.dtype), (len(self._names), layout.num_kv_heads, layout.head_size)

    def read_rows(self, slot: int, start: int, end: int) -> np.ndarray:
        """A copy of positions ``start:end`` of the slot's keys/values, every KV tensor stacked:
        ``[tensors, heads, end - start, head size]``."""
        if self.copy_obstacle is not None:
            raise UnsupportedError(f"cannot copy keys/values out: {self.copy_obstacle}")
        if not 0 <= start <= end <= int(self._lengths[slot]):
            raise ModelError(f"rows {start}:{end} are not held by slot {slot}")
        return np.stack([array[slot, :, start:end] for array in self._arrays])

    def write_rows(self, slot: int, start: int, rows: np.ndarray) -> None:
        """Put ``rows`` (as ``read_rows`` returns them) at positions ``start...`` of the slot,
        which then holds ``start + rows.shape[2]`` tokens; it must hold ``start`` already."""
        if self.copy_obstacle is not None:
            raise UnsupportedError(f"cannot copy keys/values in: {self.copy_obstacle}")
        dtype, (count, heads, size) = self.row_shape
        if rows.dtype != dtype or rows.ndim != 4 or rows.shape[::3] != (count, size) or (
                rows.shape[1] != heads):  # fmt: skip
            raise ModelError(f"rows {rows.dtype}{list(rows.shape)} do not fit this model's cache")
        if start > int(self._lengths[slot]):
            raise ModelError(f"slot {slot} holds {int(self._lengths[slot])} tokens, not {start}")
        end = start + rows.shape[2]
        self._reserve(end)
        for array, part in zip(self._arrays, rows):
            array[slot, :, start:end] = part
        self._lengths[slot] = end

    def release(self, slot: int) -> None:
        """The row keeps its keys/values (prefix reuse); its length is what it holds."""
