"""Where a pass's logits land, and the rows token choice reads.

On the CPU provider: one host buffer, grown when a pass needs more, each stage's view of it bound
by pointer and left bound while its shape holds (a decode pass allocates nothing). On a device:
a pass with one logits row per sequence writes into one device tensor bound once (a decode step
allocates nothing, and a captured graph may replay it); a wider pass's output is allocated there
per run. Only what token choice reads comes back: each row's last logits, or with greedy choice
(``argmax``) just the ids, picked on the device.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from ..session import census
from ..session.device import argmax_session, top_k_session
from .stage import BoundStage


class LogitsBuffer:
    def __init__(self, batch_size: int, vocab_size: int | None):
        self.batch_size = batch_size
        self.vocab_size = vocab_size
        self._buffer = np.empty(0, np.float32)
        self._views: dict[str, np.ndarray] = {}
        self.last: np.ndarray | None = None  # the host view the last pass wrote
        self._device_out: dict[str, ort.OrtValue] = {}  # stage -> its one-row device tensor
        # (stage, "argmax" | "top_k") -> the choice graph bound to that stage's logits tensor
        self._choosers: dict[tuple[str, str], tuple] = {}

    def bind(self, stage: BoundStage, n: int) -> None:
        """Bind ``stage``'s logits output for a pass over ``n`` tokens (``n`` = 1 also for a
        pass whose graph computes the last position's logits only)."""
        info = stage.plan.logits
        vocab = self.vocab_size
        if vocab is None or not stage.bound.device.host:
            self._bind_on_device(stage, n)
            return
        if info.rank == 3:
            # A graph with a pruned lm_head declares [B, 1, V]: last position only, any n.
            rows = 1 if info.static_dim(1) == 1 else n
            shape: tuple[int, ...] = (self.batch_size, rows, vocab)
        else:
            shape = (self.batch_size, vocab)
        size = self.batch_size * vocab * (shape[1] if len(shape) == 3 else 1)
        if self._buffer.size < size or self._buffer.dtype != info.dtype:
            self._buffer = np.empty(size, info.dtype)
        # Keyed by buffer too: with two logits stages (prefill/decode), one may have grown it.
        key = (shape, self._buffer.__array_interface__["data"][0])
        if stage.shapes.get(info.name) != key:
            self._views[stage.plan.name] = self._buffer[:size].reshape(shape)
            stage.bound.bind_output_array(info.name, self._views[stage.plan.name])
            stage.shapes[info.name] = key
        self.last = self._views[stage.plan.name]  # a decode pass: still bound

    def _bind_on_device(self, stage: BoundStage, n: int) -> None:
        info, device = stage.plan.logits, stage.bound.device
        if self.vocab_size is None or (n > 1 and info.rank == 3 and info.static_dim(1) != 1):
            stage.shapes[info.name] = "alloc"
            stage.bound.bind_output_alloc(info.name)  # [B, n, V]: sized per pass
            return
        value = self._device_out.get(stage.plan.name)
        if value is None:
            shape = (self.batch_size, 1, self.vocab_size) if info.rank == 3 else (
                self.batch_size, self.vocab_size)  # fmt: skip
            value = self._device_out[stage.plan.name] = device.empty(shape, info.dtype)
        if stage.shapes.get(info.name) != "fixed":
            stage.bound.bind_output_value(info.name, value)
            stage.shapes[info.name] = "fixed"

    def device_value(self, stage: BoundStage) -> ort.OrtValue:
        """The device tensor ``stage``'s last run wrote its logits into."""
        if stage.shapes.get(stage.plan.logits.name) == "fixed":
            return self._device_out[stage.plan.name]  # the same object each step
        return stage.bound.output(stage.plan.logits.name)

    def whole(self, stage: BoundStage) -> np.ndarray:
        """Everything ``stage``'s last run wrote (a host view, or a copy from the device)."""
        if self.vocab_size is None or not stage.bound.device.host:
            return stage.bound.device.download(self.device_value(stage))
        return self.last

    def rows(self, stage: BoundStage, last_index: np.ndarray) -> np.ndarray:
        """float32 ``[B, V]``: each row's logits at its last real token (``last_index``)."""
        if stage.bound.device.host:
            logits = self.whole(stage)
        else:
            logits = self._device_rows(stage, last_index)
        if logits.ndim == 2:
            rows = logits
        elif logits.shape[1] == 1:  # one token, or a pruned lm_head (the graph picked the row)
            rows = logits[:, 0, :]
        else:
            rows = logits[np.arange(self.batch_size), last_index]
        return rows if rows.dtype == np.float32 else rows.astype(np.float32)

    def _device_rows(self, stage: BoundStage, last_index: np.ndarray) -> np.ndarray:
        """Copied from the device: the columns where rows end (gathered there), not every
        position of a padded prompt."""
        value, columns = self._row_columns(stage, last_index)
        logits = stage.bound.device.download(value)
        if columns is None:
            return logits
        return logits[np.arange(self.batch_size), columns][:, None, :]

    def _row_columns(
        self, stage: BoundStage, last_index: np.ndarray
    ) -> tuple[ort.OrtValue, np.ndarray | None]:
        """A device tensor holding every row's last logits, and which of its columns is each
        row's (None: the tensor already has one row per sequence)."""
        value = self.device_value(stage)
        shape = value.shape()
        if len(shape) != 3 or shape[1] == 1:
            return value, None
        ends, columns = np.unique(last_index, return_inverse=True)
        return stage.bound.device.take(value, ends, axis=1), columns

    def argmax(self, stage: BoundStage, last_index: np.ndarray) -> np.ndarray:
        """int32 ``[B]``: each row's greedy token, chosen on the device (only ids come back)."""
        (chosen,) = self._choose(stage, last_index, "argmax", 0)
        return chosen.reshape(self.batch_size).astype(np.int32)

    def top_k(
        self, stage: BoundStage, last_index: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """float32 and int64 ``[B, k]``: each row's ``k`` highest logits, highest first (equal
        values: lower id first), and their ids, taken on the device (only they come back)."""
        top, chosen = self._choose(stage, last_index, "top_k", k)
        return top.reshape(self.batch_size, k), chosen.reshape(self.batch_size, k)

    def _choose(
        self, stage: BoundStage, last_index: np.ndarray, kind: str, k: int
    ) -> list[np.ndarray]:
        """Run the ``kind`` graph (ArgMax, or TopK of ``k``) over the last pass's logits on
        their device and bring back its outputs, one row per sequence. Its binding is made once
        per logits tensor (a decode step's stays the same) and kept."""
        value, columns = self._row_columns(stage, last_index)
        device = stage.bound.device
        key = (stage.plan.name, kind)
        held = self._choosers.get(key)
        if held is None or held[0] is not value or held[1] != k:
            shape = value.shape()
            binding_k = np.array([k], np.int64)  # kept alive with the binding that reads it
            if kind == "argmax":
                session = argmax_session(device, value.data_type(), len(shape))
                outputs = {"ids": (tuple(shape[:-1]), np.int64)}
            else:
                session = top_k_session(device, value.data_type(), len(shape))
                rows_k = (*shape[:-1], k)
                outputs = {"values": (rows_k, np.float32), "ids": (rows_k, np.int64)}
            binding = session.io_binding()
            binding.bind_ortvalue_input("logits", value)
            if kind == "top_k":
                binding.bind_cpu_input("k", binding_k)
            tensors = [device.empty(out, dtype) for out, dtype in outputs.values()]
            for name, tensor in zip(outputs, tensors):
                binding.bind_ortvalue_output(name, tensor)
            held = self._choosers[key] = (value, k, session, binding, tensors, binding_k)
        _, _, session, binding, tensors, _ = held
        census.run(session.run_with_iobinding, binding)
        results = [device.download(t) for t in tensors]
        if columns is not None:
            rows = np.arange(self.batch_size)
            results = [r[rows, columns] for r in results]
        return results
