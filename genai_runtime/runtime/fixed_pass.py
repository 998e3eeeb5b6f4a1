"""Passes over fixed-shape graphs (Windows ML composite style): every input fixed, the KV cache
written by the runtime. Each row's real tokens are packed ``chunk`` at a time (padded where the
cache kind wants padding), the graph runs once per chunk, and the cache takes each chunk's new
rows; the logits kept are each row's at its last real token.

The step stages share one cache: a single decoder graph, or a prefill graph (a chunk of ``C``
tokens, run on the prompt) beside a decode graph (one token, run on each new token). An encoder
in phase ``init`` that reads the prompt (T5) runs once per prompt on the prompt with EOS
appended, right-padded to its fixed source length; its outputs fill the cross-attention cache and
its mask is the decoder's ``encoder_attention_mask``; the decoder starts from the decoder start
token.

On a device the cache writes its rows there (see ``kv.fixed_shape``) and so do the logits: each
step stage's ``[B, C, V]`` logits land in one device tensor bound once, and after each chunk a
graph there copies the rows whose last real token it held into a ``[B, V]`` tensor
(``DeviceRows``); greedy choice runs ArgMax on it, so only the chosen ids come back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from ..errors import GenerationError, ModelError
from ..kv import KVCache
from ..kv.cross import CrossCache
from ..kv.fixed_shape import ChunkShape
from ..session import census
from ..session.device import (
    Device,
    StagedArray,
    argmax_session,
    pick_rows_session,
    top_k_session,
)
from ..session.positions import PositionState, encoder_source
from .logits import LogitsBuffer
from .stage import BoundStage

ROLES = ("input_ids", "attention_mask", "position_ids", "cache_position", "encoder_attention_mask")
SOURCE_ROLES = ("input_ids", "attention_mask")


@dataclass(frozen=True)
class Source:
    """An encoder reads the prompt: the token it appends, the decoder's first token, the pad."""

    eos: int
    start: int
    pad: int | None  # None: EOS pads the source


class FixedShapePass:
    def __init__(
        self,
        stages: list[BoundStage],
        stage: BoundStage,
        cache: KVCache,
        positions: PositionState,
        logits: LogitsBuffer,
        user_inputs: Mapping[str, ort.OrtValue],
        *,
        cross: CrossCache | None = None,
        source: Source | None = None,
    ):
        """``stage`` is the executor's logits stage (checked like the other step stages);
        ``user_inputs`` is the executor's own map (read at each pass)."""
        steps = [s for s in stages if s.step.when == "step"]
        self.init = [s for s in stages if s.step.when == "init"]
        others = [s for s in stages if s.step.when not in ("step", "init")]
        file = stage.plan.io.file
        if others or not steps or any(not s.has_kv or s.plan.logits is None for s in steps):
            raise ModelError(
                f"{file}: a {cache.kind} cache runs step stages that all hold the KV cache and "
                f"the logits (a decoder, or a prefill and a decode graph), after at most an "
                f"encoder in phase init; this pipeline runs "
                + ", ".join(f"{s.plan.name} ({s.step.when})" for s in stages)
            )
        if self.init and source is None:
            raise ModelError(
                f"{self.init[0].plan.io.file}: a {cache.kind} cache runs an init stage only as "
                "a text encoder that reads input_ids (the prompt)"
            )
        self.prompt = [s for s in steps if s.step.run_on_prompt]
        self.token = [s for s in steps if s.step.run_on_token_gen]
        if len(self.prompt) != 1 or len(self.token) != 1:
            raise ModelError(
                f"{file}: a {cache.kind} cache runs one step stage per kind of pass; the prompt "
                f"runs {len(self.prompt)}, each new token {len(self.token)}"
            )
        self.shapes = {id(s): self._shape(s, cache) for s in steps}
        for s in self.init:
            for feed in s.role_feeds:
                if feed.role not in SOURCE_ROLES:
                    raise ModelError(
                        f"{s.plan.io.file}: input {feed.name!r} ({feed.role}) is not fed to an "
                        f"encoder before a {cache.kind} cache (it takes "
                        f"{', '.join(SOURCE_ROLES)})"
                    )
        for s in stages:
            if s.wire_feeds:
                raise ModelError(
                    f"{s.plan.io.file}: input {s.wire_feeds[0].name!r} is wired from another "
                    f"stage; with a {cache.kind} cache the encoder's outputs reach the decoder "
                    "through the cross-attention cache only"
                )
        self.stage, self.cache, self.positions = stage, cache, positions
        self.logits, self.user_inputs = logits, user_inputs
        self.cross, self.source = cross, source
        self.batch_size = positions.batch_size
        self.ran: list[BoundStage] = []  # the stages the last pass ran (init ones included)
        self._rows: np.ndarray | None = None  # [B, V] logits of the last real tokens (host)
        device = stage.bound.device
        self.device_rows = None if device.host else DeviceRows(device, self.batch_size)
        self._casts: dict[tuple, np.ndarray] = {}
        self._source_mask: np.ndarray | None = None

    @staticmethod
    def _shape(stage: BoundStage, cache: KVCache) -> ChunkShape:
        """The chunk a step stage takes, and whether its graph writes the chunk itself (its
        mask spans the context only) or attends over past + chunk (the mask spans both)."""
        plan, file = stage.plan, stage.plan.io.file
        layout = plan.layout
        chunk = layout.new_rows if layout is not None else None
        if not chunk or layout.static_capacity != cache.capacity:
            raise ModelError(
                f"{file}: step stages sharing a {cache.kind} cache must each take a past fixed at "
                f"{cache.capacity} rows and return a fixed chunk of new rows"
            )
        for feed in stage.role_feeds:
            if feed.role not in ROLES:
                raise ModelError(
                    f"{file}: input {feed.name!r} ({feed.role}) is not fed to a fixed-shape graph "
                    f"(a {cache.kind} cache feeds {', '.join(sorted(ROLES))})"
                )
            if feed.role == "cache_position" and feed.info.rank not in (1, 2):
                raise ModelError(
                    f"{file}: cache_position {feed.info} must be [{chunk}] or [batch, {chunk}]"
                )
        info = plan.logits
        if info.rank != 3 or info.static_dim(1) not in (None, chunk):
            raise ModelError(
                f"{file}: logits {info} must be [batch, {chunk}, vocab] for a fixed-shape graph"
            )
        ctx = cache.capacity
        masks = [f.info for f in stage.role_feeds if f.role == "attention_mask"]
        width = masks[0].static_dim(masks[0].rank - 1) if masks else None
        if width not in (None, ctx, ctx + chunk):
            raise ModelError(
                f"{file}: attention_mask {masks[0]} must span the context ({ctx}: the graph "
                f"writes the chunk into its past first) or context + chunk ({ctx + chunk})"
            )
        return ChunkShape(chunk, in_graph=width == ctx)

    @property
    def on_device(self) -> bool:
        """The last real tokens' logits stay on the device (``rows`` copies them out)."""
        return self.device_rows is not None

    def rows(self) -> np.ndarray:
        """float32 [B, V]: the last pass's logits at each row's last real token (host)."""
        if self.device_rows is not None:
            return self.device_rows.rows()
        return self._rows if self._rows is not None else np.zeros((self.batch_size, 0), np.float32)

    def forward(self, tokens: np.ndarray) -> None:
        """One pass over ``tokens`` [B, n]; ``rows`` (or ``device_rows``) then holds the logits
        at each row's last real token."""
        cache, positions = self.cache, self.positions
        n, start = tokens.shape[1], positions.length
        positions.update(tokens)
        valid = cache.valid.copy()
        self.ran = []
        try:
            if self.source is not None and start == 0:
                self._encode(tokens, n)
                rows = [np.array([self.source.start], np.int64)] * self.batch_size
            else:
                real = positions.real_columns(start, n)
                rows = [tokens[b, real[b]] for b in range(self.batch_size)]
            stage = self.prompt[0] if start == 0 or n > 1 else self.token[0]
            shape = self.shapes[id(stage)]
            counts = np.array([len(row) for row in rows], np.int64)
            cache.check_room(counts, shape)
            c = shape.chunk
            for first in range(0, max(int(counts.max()), 1), c):
                cache.fill([row[first : first + c] for row in rows], shape)
                self._feed(stage)
                stage.bound.run()
                cache.commit()
                self._keep_rows(stage, first, counts, c)
            self.ran.append(stage)
            cache.advance(stage.bound, n)
        except Exception:
            positions.rewind_to(start)
            if self.source is not None and start:
                cache.valid[:] = valid  # the decoder's rows: an index-copy cache overwrites
            else:
                cache.rewind_to(start)
            raise

    def _keep_rows(self, stage: BoundStage, first: int, counts: np.ndarray, c: int) -> None:
        """Keep the logits of the rows whose last real token the chunk at ``first`` held."""
        cache = self.cache
        held = cache.rows
        ends = [bool(held[b] and first + held[b] == counts[b]) for b in range(self.batch_size)]
        if self.device_rows is not None:
            pick = self.device_rows.pick
            for b, end in enumerate(ends):  # its row in the [B * C, V] logits, or -1: keep
                pick[b] = b * c + cache.last_column(b) if end else -1
            self.device_rows.keep(stage)
            return
        logits = self.logits.whole(stage)
        out = self._rows
        if out is None or out.shape != (self.batch_size, logits.shape[2]):
            out = self._rows = np.zeros((self.batch_size, logits.shape[2]), np.float32)
        for b, end in enumerate(ends):
            if end:
                out[b] = logits[b, cache.last_column(b)]

    def _encode(self, tokens: np.ndarray, n: int) -> None:
        """Run the encoder on the prompt (EOS appended, right-padded to its fixed length)."""
        src = self.source
        real = self.positions.last_index + 1 if self.batch_size > 1 else [n]
        for stage in self.init:
            ids_info = next((f.info for f in stage.role_feeds if f.role == "input_ids"), None)
            width = ids_info.static_dim(1) if ids_info is not None else None
            if width is None:
                width = n + 1
            if n + 1 > width:
                raise GenerationError(
                    f"{stage.plan.io.file}: a prompt of {n} tokens plus EOS exceeds the "
                    f"encoder's fixed source length of {width}"
                )
            pad = src.pad if src.pad is not None else src.eos
            ids, mask = encoder_source(tokens, real, width, pad, src.eos)
            mask.flags.writeable = False  # fed every pass unchanged: a device copies it once
            self._source_mask = mask
            arrays = {"input_ids": ids, "attention_mask": mask}
            for feed in stage.role_feeds:
                stage.bound.feed(feed.name, self._cast(feed.name, arrays[feed.role], feed))
            self._bind_user(stage)
            stage.bind_alloc_outputs()
            stage.bound.run()
            self.ran.append(stage)
            if self.cross is not None and stage.plan.name == self.cross.layout.source:
                self.cross.capture(stage.bound)

    def _feed(self, stage: BoundStage) -> None:
        cache = self.cache
        arrays = {
            "input_ids": cache.ids,
            "attention_mask": cache.mask,
            "position_ids": cache.position_ids,
            "cache_position": cache.cache_position,
            "encoder_attention_mask": self._source_mask,
        }
        for feed in stage.role_feeds:
            array = arrays[feed.role]
            if array is None:
                raise ModelError(
                    f"{stage.plan.io.file}: input {feed.name!r} (encoder_attention_mask) needs "
                    "an encoder in phase init that reads input_ids"
                )
            if feed.role == "cache_position" and feed.info.rank == 1:
                # One slot vector for the whole batch (Hugging Face's StaticCache index_copy).
                if (array != array[0]).any():
                    raise GenerationError(
                        f"{stage.plan.io.file}: input {feed.name!r} {feed.info} gives one slot "
                        "per chunk column for the whole batch, but the rows hold different "
                        f"lengths ({', '.join(str(int(v)) for v in cache.valid)})"
                    )
                array = array[0]
            stage.bound.feed(feed.name, self._cast(feed.name, array, feed))
        self._bind_user(stage)
        cache.bind(stage.bound, cache.chunk)
        if stage.has_cross:
            if self.cross is None:
                raise ModelError(f"{stage.plan.io.file}: cross-attention inputs without a source")
            self.cross.bind(stage.bound)
        chunk = self.shapes[id(stage)].chunk
        if self.device_rows is not None:
            self.device_rows.bind(stage, chunk, self.logits.vocab_size)
        else:
            self.logits.bind(stage, chunk)
        stage.bind_alloc_outputs()

    def _bind_user(self, stage: BoundStage) -> None:
        for feed in stage.user_feeds:
            if feed.name not in self.user_inputs:
                raise GenerationError(
                    f"{stage.plan.io.file} needs input {feed.name!r} ({feed.info}), which no "
                    "role or cache provides: set it with set_inputs() / set_model_input()"
                )
            stage.bound.bind_value(feed.name, self.user_inputs[feed.name])

    def _cast(self, name: str, array: np.ndarray, feed) -> np.ndarray:
        dtype = feed.info.dtype
        if array.dtype == dtype:
            return array
        key = (name, array.shape)  # one per input and shape: rebound by pointer every chunk
        out = self._casts.get(key)
        if out is None or out.dtype != dtype:
            out = self._casts[key] = np.zeros(array.shape, dtype)
        out[...] = array
        return out


class DeviceRows:
    """On a device, the logits of a fixed-chunk pass: each step stage's ``[B, C, V]`` output
    is one device tensor bound once; ``keep`` runs a graph there that copies the rows ``pick``
    names into ``last`` ``[B, V]`` (one address), which token choice reads where it is."""

    def __init__(self, device: Device, batch_size: int):
        self.device = device
        self.batch_size = batch_size
        self.pick = np.full(batch_size, -1, np.int64)  # per row: b * C + column, or -1: keep
        self._staged: StagedArray | None = None
        self._last: ort.OrtValue | None = None
        self._logits: dict[str, ort.OrtValue] = {}  # stage -> its logits tensor
        self._keepers: dict[str, tuple] = {}  # stage -> (logits, session, binding)
        self._choosers: dict[tuple[str, int], tuple] = {}

    def bind(self, stage: BoundStage, chunk: int, vocab: int | None) -> None:
        info, name = stage.plan.logits, stage.plan.name
        if vocab is None:  # sized by the graph: allocated per run
            stage.bound.bind_output_alloc(info.name)
            self._logits.pop(name, None)
        elif name not in self._logits:
            shape = (self.batch_size, chunk, vocab)
            self._logits[name] = self.device.empty(shape, info.dtype)
            stage.bound.bind_output_value(info.name, self._logits[name])

    def keep(self, stage: BoundStage) -> None:
        name = stage.plan.name
        value = self._logits.get(name)
        if value is None:
            value = stage.bound.output(stage.plan.logits.name)
        if self._last is None:
            shape, dtype = (self.batch_size, value.shape()[2]), stage.plan.logits.dtype
            self._last = self.device.zeros(shape, dtype, 1)[0]
            self._staged = StagedArray(self.device, self.pick)
        self._staged.sync(self.pick)
        held = self._keepers.get(name)
        if held is None or held[0] is not value:
            session = pick_rows_session(self.device, value.data_type())
            binding = session.io_binding()
            binding.bind_ortvalue_input("logits", value)
            binding.bind_ortvalue_input("last", self._last)
            binding.bind_ortvalue_output("out", self._last)  # the same tensor: in place
            binding.bind_ortvalue_input("pick", self._staged.value)
            held = self._keepers[name] = (value, session, binding)
        census.run(held[1].run_with_iobinding, held[2])

    def rows(self) -> np.ndarray:
        if self._last is None:
            return np.zeros((self.batch_size, 0), np.float32)
        rows = self.device.download(self._last)
        return rows if rows.dtype == np.float32 else rows.astype(np.float32)

    def argmax(self) -> np.ndarray:
        """int32 [B]: each row's greedy token, chosen on the device (only the ids come back)."""
        (chosen,) = self._choose("argmax", 0)
        return chosen.reshape(self.batch_size).astype(np.int32)

    def top_k(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """float32 and int64 [B, k]: each row's k highest logits, highest first, and their ids,
        taken on the device."""
        top, chosen = self._choose("top_k", k)
        return top.reshape(self.batch_size, k), chosen.reshape(self.batch_size, k)

    def _choose(self, kind: str, k: int) -> list[np.ndarray]:
        held = self._choosers.get((kind, k))
        if held is None:
            data_type, b = self._last.data_type(), self.batch_size
            k_input = np.array([k], np.int64)  # kept alive with the binding that reads it
            if kind == "argmax":
                session = argmax_session(self.device, data_type, 2)
                outputs = {"ids": ((b,), np.int64)}
            else:
                session = top_k_session(self.device, data_type, 2)
                outputs = {"values": ((b, k), np.float32), "ids": ((b, k), np.int64)}
            binding = session.io_binding()
            binding.bind_ortvalue_input("logits", self._last)
            if kind == "top_k":
                binding.bind_cpu_input("k", k_input)
            tensors = [self.device.empty(shape, dtype) for shape, dtype in outputs.values()]
            for name, tensor in zip(outputs, tensors):
                binding.bind_ortvalue_output(name, tensor)
            held = self._choosers[(kind, k)] = (session, binding, tensors, k_input)
        session, binding, tensors, _ = held
        census.run(session.run_with_iobinding, binding)
        return [self.device.download(t) for t in tensors]
