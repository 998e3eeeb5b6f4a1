"""The one generic executor: runs a plan's stages phase by phase over pre-bound sessions.

A pass feeds ``n`` new tokens per row: every stage whose phase and prompt/token flags match runs
in flow order; inputs come from the runtime's roles (ids, mask, positions, length scalars), from
wires (another stage's output of this pass), from the KV cache, or from the user. Buffers are
allocated once and rebound only when a shape changes, so a one-token pass allocates nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnxruntime as ort

from ..errors import GenerationError, ModelError
from ..kv import KVCache, KVPlan, make_cache
from .bound import BoundSession
from .plan import SCALAR_ROLES, Plan, StagePlan
from .positions import PositionState
from .sessions import run_options


class _Stage:
    """A StagePlan bound to its session for one generator."""

    def __init__(self, plan: StagePlan, session: ort.InferenceSession):
        self.plan = plan
        self.step = plan.step
        self.bound = BoundSession(
            plan.name, session, plan.io, run_options(dict(plan.session.options.run_options))
        )
        self.shapes: dict[str, tuple[int, ...]] = {}  # last shape bound per input/output
        self.role_feeds = plan.feeds_from("role")
        self.wire_feeds = plan.feeds_from("wire")
        self.user_feeds = plan.feeds_from("user")
        self.has_kv = bool(plan.feeds_from("kv"))
        claimed = set()
        if plan.layout is not None:
            claimed.update(n for layer in plan.layout.present for n in layer)
        if plan.logits is not None:
            claimed.add(plan.logits.name)
        # Wire sources, and the rest (readable through get_output()), are allocated by
        # onnxruntime per run: their shapes change with the number of tokens in a pass.
        self.alloc_outputs = [n for n in plan.io.outputs if n not in claimed]

    def bind_alloc_outputs(self) -> None:
        # Rebinding drops the tensor the last run left bound, which onnxruntime would otherwise
        # take as a preallocated output of the old shape.
        for name in self.alloc_outputs:
            self.bound.bind_output_alloc(name)


class Executor:
    def __init__(
        self,
        plan: Plan,
        sessions: Mapping[str, ort.InferenceSession],
        kv_plan: KVPlan | None,
        *,
        batch_size: int,
        max_length: int,
        pad_token_id: int | None,
    ):
        self.plan = plan
        self.batch_size = batch_size
        self.max_length = max_length
        self.stages = [_Stage(p, sessions[p.name]) for p in plan.stages]
        self.cache: KVCache | None = (
            make_cache(kv_plan, batch_size, max_length) if kv_plan else None
        )
        mask_dtype = pos_dtype = np.dtype(np.int64)
        for stage in plan.stages:
            for feed in stage.feeds_from("role"):
                if feed.role == "attention_mask":
                    mask_dtype = feed.info.dtype
                elif feed.role == "position_ids":
                    pos_dtype = feed.info.dtype
        self.positions = PositionState(batch_size, max_length, pad_token_id, mask_dtype, pos_dtype)
        self.user_inputs: dict[str, ort.OrtValue] = {}
        self._ids: dict[tuple, np.ndarray] = {}
        self._scalars: dict[str, np.ndarray] = {}
        self._logits_buf = np.empty(0, np.float32)
        self._logits_out: np.ndarray | None = None
        self._last_run: dict[str, _Stage] = {}
        self._logits_stage = next(s for s in self.stages if s.plan.logits is not None)

    @property
    def length(self) -> int:
        return self.positions.length

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        """Run one pass over ``tokens`` [B, n]; return logits [B, V] at each row's last token.

        The returned array may be a view into a buffer the next pass overwrites.
        """
        n = tokens.shape[1]
        if self.length + n > self.max_length:
            raise GenerationError(
                f"{n} new tokens + {self.length} already processed exceed max_length "
                f"{self.max_length}"
            )
        first = self.length == 0
        prompt_pass = first or n > 1
        start = self.length
        self.positions.update(tokens)
        try:
            for stage in self.stages:
                step = stage.step
                if step.when == "final" or (step.when == "init" and not first):
                    continue
                if step.when == "step" and not (
                    step.run_on_prompt if prompt_pass else step.run_on_token_gen
                ):
                    continue
                self._feed(stage, tokens, start, n)
                stage.bound.run()
                self._last_run[stage.plan.name] = stage
                if stage.has_kv and self.cache is not None:
                    self.cache.advance(stage.bound, n)
        except Exception:
            self.positions.rewind_to(start)  # the pass did not happen
            if self.cache is not None:
                self.cache.rewind_to(start)
            raise
        return self._read_logits(n)

    def rewind_to(self, length: int) -> None:
        self.positions.rewind_to(length)
        if self.cache is not None:
            self.cache.rewind_to(length)

    # -- feeding ---------------------------------------------------------------------------

    def _feed(self, stage: _Stage, tokens: np.ndarray, start: int, n: int) -> None:
        bound = stage.bound
        for feed in stage.role_feeds:
            role = feed.role
            if role == "input_ids":
                ids = self._ids_buffer(feed.info.dtype, tokens)
                self._bind(stage, feed.name, ids)
            elif role == "attention_mask":
                self._bind(stage, feed.name, self.positions.mask())
            elif role == "position_ids":
                self._bind(stage, feed.name, self.positions.positions(n))
            elif role in SCALAR_ROLES:
                value = {"current_sequence_length": n, "total_sequence_length": start + n}
                self._bind(stage, feed.name, self._scalar(feed, value.get(role, start)))
            else:  # inputs_embeds with no wire: nothing the runtime can compute
                raise ModelError(
                    f"{stage.plan.io.file}: input {feed.name!r} ({role}) needs a wire from an "
                    "embedding stage in pipeline.dataflow"
                )
        for feed in stage.wire_feeds:
            source = self._last_run.get(feed.wire.src)
            if source is None:
                raise GenerationError(f"wire {feed.wire}: {feed.wire.src!r} has not run yet")
            bound.bind_value(feed.name, source.bound.output(feed.wire.src_tensor))
        for feed in stage.user_feeds:
            if feed.name not in self.user_inputs:
                raise GenerationError(
                    f"{stage.plan.io.file} needs input {feed.name!r} ({feed.info}), which no "
                    "role, wire or cache provides: set it with set_model_input()"
                )
            bound.bind_value(feed.name, self.user_inputs[feed.name])
        if stage.has_kv and self.cache is not None:
            self.cache.bind(bound, n)
        if stage.plan.logits is not None:
            self._bind_logits(stage, n)
        stage.bind_alloc_outputs()

    def _bind(self, stage: _Stage, name: str, array: np.ndarray) -> None:
        """Bind by pointer; a buffer whose pointer and shape are unchanged stays bound (its
        contents are read at run time, so updating it in place is enough)."""
        key = (array.__array_interface__["data"][0], array.shape)
        if stage.shapes.get(name) != key:
            stage.bound.bind_array(name, array)
            stage.shapes[name] = key

    def _ids_buffer(self, dtype: np.dtype, tokens: np.ndarray) -> np.ndarray:
        shape = tokens.shape
        view = self._ids.get((dtype, shape))
        if view is None:  # one small buffer per (dtype, shape): a decode pass reuses its own
            view = self._ids[(dtype, shape)] = np.zeros(shape, dtype)
        view[...] = tokens
        return view

    def _scalar(self, feed, value: int) -> np.ndarray:
        arr = self._scalars.get(feed.name)
        if arr is None:
            shape = tuple(1 if not isinstance(d, int) else d for d in feed.info.shape)
            arr = np.zeros(shape, feed.info.dtype)
            self._scalars[feed.name] = arr
        arr[...] = value
        return arr

    def _bind_logits(self, stage: _Stage, n: int) -> None:
        info = stage.plan.logits
        vocab = self.plan.vocab_size
        if vocab is None:
            stage.bound.bind_output_alloc(info.name)
            return
        shape = (self.batch_size, n, vocab) if info.rank == 3 else (self.batch_size, vocab)
        if stage.shapes.get(info.name) == shape:
            return  # a decode pass: the same buffer stays bound
        size = self.batch_size * vocab * (n if info.rank == 3 else 1)
        if self._logits_buf.size < size or self._logits_buf.dtype != info.dtype:
            self._logits_buf = np.empty(size, info.dtype)
        self._logits_out = self._logits_buf[:size].reshape(shape)
        stage.bound.bind_output_array(info.name, self._logits_out)
        stage.shapes[info.name] = shape

    def _read_logits(self, n: int) -> np.ndarray:
        stage = self._logits_stage
        if self.plan.vocab_size is None:
            logits = stage.bound.output(stage.plan.logits.name).numpy()
        else:
            logits = self._logits_out
        if logits.ndim == 2:
            rows = logits
        elif n == 1:
            rows = logits[:, 0, :]
        else:
            rows = logits[np.arange(self.batch_size), self.positions.last_index]
        return rows if rows.dtype == np.float32 else rows.astype(np.float32)

    def pass_logits(self) -> np.ndarray:
        """Logits ``[B, n, V]`` at every position of the last pass (a view the next pass
        overwrites); speculative verification scores all drafted tokens from one pass."""
        stage = self._logits_stage
        if stage.plan.logits.rank != 3:
            raise ModelError(
                f"{stage.plan.io.file}: logits {stage.plan.logits} hold the last position only"
            )
        if self.plan.vocab_size is None:
            return stage.bound.output(stage.plan.logits.name).numpy()
        return self._logits_out

    def output(self, name: str) -> np.ndarray:
        """An output of the last pass, by tensor name (for ``Generator.get_output``)."""
        for stage in self._last_run.values():
            if name not in stage.plan.io.outputs:
                continue
            logits = stage.plan.logits
            if logits is not None and name == logits.name and self._logits_out is not None:
                return self._logits_out.copy()
            return stage.bound.output(name).numpy().copy()
        raise GenerationError(f"no stage has run with an output named {name!r}")
