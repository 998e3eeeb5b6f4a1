"""Passes over a fixed-shape graph (Windows ML composite style): every input fixed, the KV cache
written by the runtime. Each row's real tokens are packed ``chunk`` at a time (padded where the
cache kind wants padding), the graph runs once per chunk, and the cache takes each chunk's new
rows; the logits kept are each row's at its last real token."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnxruntime as ort

from ..errors import GenerationError, ModelError
from ..kv import KVCache
from ..session.positions import PositionState
from .logits import LogitsBuffer
from .stage import BoundStage

ROLES = ("input_ids", "attention_mask", "position_ids", "cache_position")


class FixedShapePass:
    def __init__(
        self,
        stages: list[BoundStage],
        stage: BoundStage,
        cache: KVCache,
        positions: PositionState,
        logits: LogitsBuffer,
        user_inputs: Mapping[str, ort.OrtValue],
    ):
        """``stage`` holds the cache and the logits; ``user_inputs`` is the executor's own map
        (read at each pass)."""
        steps = [s for s in stages if s.step.when == "step"]
        if len(stages) != 1 or steps != [stage] or not stage.has_kv:
            raise ModelError(
                f"{stage.plan.io.file}: a {cache.kind} cache runs a single decoder stage "
                f"that holds the KV cache and the logits; this pipeline has {len(stages)} stages"
            )
        for feed in stage.role_feeds:
            if feed.role not in ROLES:
                raise ModelError(
                    f"{stage.plan.io.file}: input {feed.name!r} ({feed.role}) is not fed to a "
                    f"fixed-shape graph (a {cache.kind} cache feeds {', '.join(sorted(ROLES))})"
                )
        info = stage.plan.logits
        if info.rank != 3 or info.static_dim(1) not in (None, cache.chunk):
            raise ModelError(
                f"{stage.plan.io.file}: logits {info} must be [batch, {cache.chunk}, "
                "vocab] for a fixed-shape graph"
            )
        self.stage, self.cache, self.positions = stage, cache, positions
        self.logits, self.user_inputs = logits, user_inputs
        self.batch_size = positions.batch_size
        self._rows: np.ndarray | None = None  # [B, V] logits of the last real tokens
        self._casts: dict[str, np.ndarray] = {}

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        """One pass over ``tokens`` [B, n]; logits [B, V] at each row's last real token."""
        cache, stage, positions = self.cache, self.stage, self.positions
        n, start = tokens.shape[1], positions.length
        positions.update(tokens)
        try:
            real = positions.real_columns(start, n)
            rows = [tokens[b, real[b]] for b in range(self.batch_size)]
            counts = real.sum(axis=1)
            cache.check_room(counts)
            c = cache.chunk
            for first in range(0, max(int(counts.max()), 1), c):
                cache.fill([row[first : first + c] for row in rows])
                self._feed()
                stage.bound.run()
                cache.commit()
                logits = self.logits.whole(stage)
                out = self._rows
                if out is None or out.shape != (self.batch_size, logits.shape[2]):
                    out = self._rows = np.zeros((self.batch_size, logits.shape[2]), np.float32)
                for b in range(self.batch_size):
                    if cache.rows[b] and first + cache.rows[b] == counts[b]:  # its last token
                        out[b] = logits[b, cache.last_column(b)]
            cache.advance(stage.bound, n)
        except Exception:
            positions.rewind_to(start)
            cache.rewind_to(start)
            raise
        return out

    def _feed(self) -> None:
        cache, stage = self.cache, self.stage
        arrays = {
            "input_ids": cache.ids,
            "attention_mask": cache.mask,
            "position_ids": cache.position_ids,
            "cache_position": cache.cache_position,
        }
        for feed in stage.role_feeds:
            array = arrays[feed.role]
            if array.dtype != feed.info.dtype:
                array = self._cast(feed.name, array, feed.info.dtype)
            stage.bound.feed(feed.name, array)
        for feed in stage.user_feeds:
            if feed.name not in self.user_inputs:
                raise GenerationError(
                    f"{stage.plan.io.file} needs input {feed.name!r} ({feed.info}), which no "
                    "role or cache provides: set it with set_inputs() / set_model_input()"
                )
            stage.bound.bind_value(feed.name, self.user_inputs[feed.name])
        cache.bind(stage.bound, cache.chunk)
        self.logits.bind(stage, cache.chunk)
        stage.bind_alloc_outputs()

    def _cast(self, name: str, array: np.ndarray, dtype: np.dtype) -> np.ndarray:
        out = self._casts.get(name)
        if out is None or out.dtype != dtype:  # one per input: rebound by pointer every chunk
            out = self._casts[name] = np.zeros(array.shape, dtype)
        out[...] = array
        return out
