"""Where a pass's logits land, and the rows token choice reads.

On the CPU provider: one host buffer, grown when a pass needs more, each stage's view of it bound
by pointer and left bound while its shape holds (a decode pass allocates nothing). On a device:
onnxruntime allocates the output there, and only the rows token choice reads are copied out.
"""

from __future__ import annotations

import numpy as np

from .stage import BoundStage


class LogitsBuffer:
    def __init__(self, batch_size: int, vocab_size: int | None):
        self.batch_size = batch_size
        self.vocab_size = vocab_size
        self._buffer = np.empty(0, np.float32)
        self._views: dict[str, np.ndarray] = {}
        self.last: np.ndarray | None = None  # the host view the last pass wrote

    def bind(self, stage: BoundStage, n: int) -> None:
        """Bind ``stage``'s logits output for a pass over ``n`` tokens."""
        info = stage.plan.logits
        vocab = self.vocab_size
        if vocab is None or not stage.bound.device.host:
            # On a device the logits stay there until the rows token choice needs are taken.
            stage.bound.bind_output_alloc(info.name)
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

    def whole(self, stage: BoundStage) -> np.ndarray:
        """Everything ``stage``'s last run wrote (a host view, or a copy from the device)."""
        if self.vocab_size is None or not stage.bound.device.host:
            return stage.bound.output(stage.plan.logits.name).numpy()
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
        """Copied from the device: each row's last real token when all rows end at the same
        column (one small gather there), else all rows."""
        value = stage.bound.output(stage.plan.logits.name)
        shape = value.shape()
        if len(shape) == 3 and shape[1] > 1:
            last = np.unique(last_index)
            if last.size == 1:
                return stage.bound.device.take(value, last, axis=1).numpy()
        return value.numpy()
