"""The one generic executor: runs a plan's stages phase by phase over pre-bound sessions.

A pass feeds ``n`` new tokens per row: every stage whose phase and prompt/token flags match runs
in flow order; inputs come from the runtime's roles (ids, mask, positions, length scalars), from
wires (another stage's output of this pass), from the KV or cross-attention cache, or from the
user. Buffers are allocated once and rebound only when a shape changes, so a one-token pass
allocates nothing.

Phases: ``init`` stages run before the first pass after their inputs are set (encoders, vision
towers; ``loop: per_image`` runs one image at a time and concatenates), ``step`` stages every
pass, ``final`` stages once when the generator finishes (``finish``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import onnxruntime as ort

from ..errors import GenerationError, ModelError, UnsupportedError
from ..kv import KVCache, KVPlan, make_cache
from ..kv.base import check_rows
from ..kv.cross import CrossCache
from ..session.device import HOST, Device
from ..session.graph_io import LAST_POSITION_SWITCH
from ..session.positions import PositionState, encoder_source
from ..spec import TokensSpec
from .cuda_graphs import CudaGraphs
from .fixed_pass import FixedShapePass, Source
from .logits import LogitsBuffer
from .plan import RECURRENT_ROLES, SCALAR_ROLES, Plan
from .stage import BoundStage, stage_output

# The two values a graph's last-position switch is fed; read-only, so a device tensor staged
# from either needs no new copy while the same one is fed (``BoundSession.feed``).
_SWITCH = {False: np.array(False), True: np.array(True)}
for _value in _SWITCH.values():
    _value.flags.writeable = False


@dataclass(frozen=True)
class TreePass:
    """How the tokens of one batch-1 pass relate (a token tree flattened): token i sits at
    position ``start + offsets[i]`` and attends to the tokens j of this pass with
    ``visible[i, j]`` (its ancestors and itself), and to everything before the pass."""

    offsets: np.ndarray  # int64 [n]
    visible: np.ndarray  # bool [n, n]


def tree_obstacle(plan: Plan, can_compact: bool) -> str | None:
    """Why a pass over ``plan`` cannot verify a token tree (each token attending to its
    ancestors only), or None when it can: that needs a 4D attention mask on every stage that
    takes one, no init stages, and a cache that can keep one path of what a pass wrote."""
    masks = [
        f.info for s in plan.stages for f in s.feeds_from("role") if f.role == "attention_mask"
    ]
    if not masks:
        return "the target takes no attention mask (a token tree needs a 4D mask)"
    flat = next((m for m in masks if m.rank != 4), None)
    if flat is not None:
        return f"the target takes a {flat.rank}D attention mask (a token tree needs a 4D mask)"
    if any(s.step.when == "init" for s in plan.stages):
        return "the target has init stages (an encoder or vision tower)"
    if not can_compact:
        return "the target's cache cannot keep one path of a tree (concat or share-buffer can)"
    return None


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
        tokens: TokensSpec | None = None,
    ):
        self.plan = plan
        self._pad = pad_token_id
        self.batch_size = batch_size
        self.max_length = max_length
        self.stages = [BoundStage(p, sessions[p.name]) for p in plan.stages]
        mask_dtype = pos_dtype = np.dtype(np.int64)
        for stage in plan.stages:
            for feed in stage.feeds_from("role"):
                if feed.role == "attention_mask":
                    mask_dtype = feed.info.dtype
                elif feed.role == "position_ids":
                    pos_dtype = feed.info.dtype
        self.positions = PositionState(batch_size, max_length, pad_token_id, mask_dtype, pos_dtype)
        self.cross = CrossCache(plan.cross) if plan.cross is not None else None
        self.device = _kv_device(self.stages)
        self.cache: KVCache | None = (
            make_cache(kv_plan, batch_size, max_length, self.positions, self.device)
            if kv_plan
            else None
        )
        self.user_inputs: dict[str, ort.OrtValue] = {}
        self._init_stages = [s for s in self.stages if s.step.when == "init"]
        # An init stage that reads the prompt (a text encoder): the prompt, with EOS appended per
        # row, is its source; step stages start from the decoder start token and count their own
        # positions. (onnxruntime-genai's encoder-decoder convention.)
        self._source = any(f.role == "input_ids" for s in self._init_stages for f in s.role_feeds)
        tokens = tokens or TokensSpec()
        self._source_eos = tokens.eos[0] if tokens.eos else None
        start_token = tokens.decoder_start if tokens.decoder_start is not None else tokens.bos
        self._start_token = start_token
        if self._source and (self._source_eos is None or start_token is None):
            raise ModelError(
                "an init stage reads input_ids (a text encoder): tokens.eos and tokens.bos (or "
                "tokens.decoder_start) must be set"
            )
        self._step_positions = (
            PositionState(batch_size, max_length, None, mask_dtype, pos_dtype)
            if self._source
            else self.positions
        )
        self._source_mask: np.ndarray | None = None
        self._masks: dict[tuple, np.ndarray] = {}
        self._recurrent: dict[str, ort.OrtValue] = {}
        self._snapshot: tuple[int, dict[str, ort.OrtValue]] | None = None  # see ``snapshot``
        self._final_stages = [s for s in self.stages if s.step.when == "final"]
        self._init_done = not self._init_stages
        self._final_done = False
        self._last_tokens = np.zeros((batch_size, 1), np.int64)
        self._last_position_pass = False  # the last pass computed its last rows' logits only
        self._ids: dict[tuple, np.ndarray] = {}
        self._scalars: dict[str, np.ndarray] = {}
        self.logits = LogitsBuffer(batch_size, plan.vocab_size)
        self._last_run: dict[str, BoundStage] = {}
        self._logits_stage = next(s for s in self.stages if s.plan.logits is not None)
        self._fixed: FixedShapePass | None = None
        self._tree: TreePass | None = None  # set during a token-tree pass
        if self.cache is not None and self.cache.chunk:
            source = Source(self._source_eos, start_token, self._pad) if self._source else None
            self._fixed = FixedShapePass(
                self.stages, self._logits_stage, self.cache, self.positions, self.logits,
                self.user_inputs, cross=self.cross, source=source,
            )  # fmt: skip
        # On a device, a cache that declares it lets decode steps feed the whole [B, max_length]
        # mask, so a captured graph replays; uncaptured steps feed the mask's true width (as
        # onnxruntime-genai does: attention kernels split their work by it).
        cache = self.cache
        self._static_mask = not self.device.host and cache is not None and cache.static_mask
        self.graph_note = "off (host execution)"
        self.graph = None if self.device.host else CudaGraphs.setup(self, self._static_mask)

    @property
    def length(self) -> int:
        return self.positions.length

    @cached_property
    def takes_tree(self) -> bool:
        """Whether a pass can verify a token tree (see ``tree_obstacle``); fixed at creation."""
        return (
            self.batch_size == 1
            and self._fixed is None
            and tree_obstacle(self.plan, self.cache is not None and self.cache.can_compact) is None
        )

    @property
    def logits_on_device(self) -> bool:
        """The logits stay on a device after a pass (``run``): ``rows`` copies them out,
        ``argmax`` brings back only the greedy ids."""
        if self._fixed is not None:  # chunked passes keep each row's last logits themselves
            return self._fixed.on_device
        return not self._logits_stage.bound.device.host

    def rows(self) -> np.ndarray:
        """float32 [B, V]: the last pass's logits at each row's last token (host)."""
        if self._fixed is not None:
            return self._fixed.rows()
        return self.logits.rows(self._logits_stage, self.positions.last_index)

    def argmax(self) -> np.ndarray:
        """int32 [B]: each row's greedy token from the last pass, chosen where the logits are."""
        if not self.logits_on_device:
            return np.argmax(self.rows(), axis=-1).astype(np.int32)
        if self._fixed is not None:
            return self._fixed.device_rows.argmax()
        return self.logits.argmax(self._logits_stage, self.positions.last_index)

    def top_k(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """float32 and int64 [B, k]: each row's k highest logits from the last pass and their
        ids, taken where the logits are (``logits_on_device``)."""
        if self._fixed is not None:
            return self._fixed.device_rows.top_k(k)
        return self.logits.top_k(self._logits_stage, self.positions.last_index, k)

    def forward(
        self, tokens: np.ndarray, tree: TreePass | None = None, *, every_row: bool = False
    ) -> np.ndarray:
        """Run one pass over ``tokens`` [B, n]; return logits [B, V] at each row's last token.

        ``tree`` lays the tokens out as a token tree (see ``takes_tree``); ``keep`` then keeps
        one path. The returned array may be a view into a buffer the next pass overwrites.
        ``every_row``: ``pass_logits`` will be read, so a graph with the last-position switch
        computes every position's logits (else it is asked for the last ones only).
        """
        self.run(tokens, tree, every_row=every_row)
        return self.rows()

    def run(
        self, tokens: np.ndarray, tree: TreePass | None = None, *, every_row: bool = False
    ) -> None:
        """``forward`` without reading the logits (``rows`` or ``argmax`` reads them)."""
        if tree is not None:
            if not self.takes_tree:
                raise UnsupportedError(
                    f"{self._logits_stage.plan.io.file}: a token-tree pass needs a 4D "
                    "attention_mask, batch size 1 and a cache that can compact"
                )
            self._tree = tree
            try:
                return self.run(tokens, every_row=True)
            finally:
                self._tree = None
        n = tokens.shape[1]
        if self.length + n > self.max_length:
            raise GenerationError(
                f"{n} new tokens + {self.length} already processed exceed max_length "
                f"{self.max_length}"
            )
        if self._fixed is not None:
            self._fixed.forward(tokens)
            self._last_run.update((s.plan.name, s) for s in self._fixed.ran)
            self._last_tokens = tokens
            return
        prompt_pass = self.length == 0 or n > 1
        decode = not prompt_pass and self._tree is None
        start = self.length
        self.positions.update(tokens)
        if self._tree is not None:
            self.positions.branch(self._tree.offsets)
        self._final_done = False
        self._last_tokens = tokens
        self._last_position_pass = False
        step_length = self._step_positions.length
        seq_start = start
        try:
            if not self._init_done:
                if self._source:
                    if start:
                        raise GenerationError(
                            "the encoder reads the prompt: rewind_to(0) before a new one"
                        )
                    self._masks.clear()  # casts of the previous source's mask
                    source, self._source_mask = self._source_ids(tokens)
                    for stage in self._init_stages:
                        self._run_init(stage, source, 0, source.shape[1])
                    tokens = np.full((self.batch_size, 1), self._start_token, np.int64)
                    n = 1
                else:
                    for stage in self._init_stages:
                        self._run_init(stage, tokens, start, n)
                self._init_done = True
            if self._source:
                start = self._step_positions.length
                self._step_positions.update(tokens)
            for stage in self.stages:
                step = stage.step
                if step.when != "step" or not (
                    step.run_on_prompt if prompt_pass else step.run_on_token_gen
                ):
                    continue
                last_only = n > 1 and not every_row and stage.last_position_switch
                self._feed(stage, tokens, start, n, last_only, decode)
                self._run_stage(stage, decode and self.graph is not None)
                self._last_position_pass |= last_only
                self._last_run[stage.plan.name] = stage
                if stage.plan.logits is not None:
                    self._logits_stage = stage
                for name, out in stage.recurrent:
                    self._recurrent[name] = stage.bound.output(out)
                if stage.has_kv and self.cache is not None:
                    self.cache.advance(stage.bound, n)
        except Exception:  # the pass did not happen
            self.positions.rewind_to(seq_start)
            self._step_positions.rewind_to(step_length)
            if self.cache is not None:
                self.cache.rewind_to(step_length)
            raise

    def _run_stage(self, stage: BoundStage, graph: bool) -> None:
        if not graph:
            stage.bound.run()
            return
        try:
            stage.bound.run(graph=True)
        except Exception as exc:
            self.graph.failed(self, exc)  # the step runs again, uncaptured, from here on
            self.graph = None
            stage.bound.run()

    # -- fixed-shape graphs ----------------------------------------------------------------

    def rewind_to(self, length: int) -> None:
        """Forget tokens past ``length``; init outputs (cross cache, image features) stay."""
        if length >= self.length:
            return
        if self._source and length:
            raise GenerationError(
                f"cannot rewind to {length}: the encoder read the prompt, so only rewind_to(0) "
                "(a new prompt) is possible"
            )
        restore = self._snapshot is not None and self._snapshot[0] == length
        if self._recurrent and length and not restore:
            raise GenerationError(
                f"cannot rewind: a recurrent state ({', '.join(self._recurrent)}) rewinds only "
                "to 0 or to where snapshot_state was called"
            )
        if self.cache is not None:  # first: a cache may refuse (evicted rows), changing nothing
            self.cache.rewind_to(length)
        self.positions.rewind_to(length)
        self._step_positions.rewind_to(length)
        if restore and length:
            self._recurrent.update(self._snapshot[1])
        if length == 0:
            self._recurrent.clear()
            self._snapshot = None
            if self._source:
                self._init_done = False  # the next prompt is a new source
        self._final_done = False

    # -- copying a prompt's keys/values out and in (prompt caches) ----------------------------

    @property
    def copy_obstacle(self) -> str | None:
        """Why ``read_kv`` / ``write_kv`` cannot run here (None: they can): they need batch 1,
        a cache kind that copies rows, and no state besides it (init stages, recurrences)."""
        if self.cache is None:
            return "the model keeps no self-attention KV cache"
        if self.batch_size != 1:
            return f"rows are copied at batch size 1, not {self.batch_size}"
        if self._init_stages:
            return "init stages (an encoder or vision tower) read inputs that rows do not carry"
        if any(stage.recurrent for stage in self.stages):
            return "a recurrent state is carried from pass to pass, not kept per position"
        return self.cache.copy_obstacle

    @property
    def kv_rows(self) -> tuple[np.dtype, tuple[int, int, int]]:
        """The dtype and ``(tensors, heads, head size)`` of one position's keys/values."""
        self._check_copy()
        return self.cache.row_shape

    def read_kv(self, start: int, end: int) -> np.ndarray:
        """A copy of the keys/values of positions ``start:end`` (tokens already run), every KV
        tensor stacked: ``[tensors, heads, end - start, head size]``."""
        self._check_copy()
        return self.cache.read_rows(start, end)

    def write_kv(self, start: int, rows: np.ndarray) -> None:
        """Keep the first ``start`` tokens and put ``rows`` (as ``read_kv`` gives them) after
        them, as if their tokens had run: the next pass continues after them. No logits come
        with them (a pass over the tokens after them gives those)."""
        self._check_copy()
        check_rows(rows, self.cache.row_shape, "this model's keys/values")  # before the rewind
        n = rows.shape[2]
        if not 0 <= start <= self.length or start + n > self.max_length:
            raise GenerationError(
                f"{n} positions at {start} do not fit: {self.length} tokens held, max_length "
                f"{self.max_length}"
            )
        self.rewind_to(start)
        self.cache.write_rows(start, rows)
        self.positions.update(np.zeros((1, n), np.int64))  # batch 1: only the count matters
        self._last_position_pass = False
        self._final_done = False

    def _check_copy(self) -> None:
        why = self.copy_obstacle
        if why is not None:
            raise UnsupportedError(f"cannot copy keys/values: {why}")

    def snapshot(self) -> None:
        """Keep the recurrent state at this length for ``rewind_to`` it (the reference's
        ``snapshot_state``). Each pass allocates new state outputs, so holding them is a copy."""
        self._snapshot = (self.length, dict(self._recurrent)) if self._recurrent else None

    def reorder_rows(self, rows: np.ndarray) -> None:
        """Cache row i takes old row ``rows[i]`` (beam search: among one prompt's rows, which
        share positions and cross-attention inputs)."""
        if self._recurrent:
            held = ", ".join(self._recurrent)
            raise UnsupportedError(f"beam search cannot reorder the rows of {held}")
        if self.cache is not None:
            self.cache.reorder(rows)

    def _source_ids(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The encoder's ids: each row's real tokens, then EOS, right-padded; and its mask."""
        real = self.positions.last_index + 1 if self.batch_size > 1 else [tokens.shape[1]]
        pad = self._pad if self._pad is not None else self._source_eos
        return encoder_source(tokens, real, tokens.shape[1] + 1, pad, self._source_eos)

    def finish(self) -> None:
        """Run the final-phase stages once for the current sequence (no-op if already run)."""
        if self._final_done or not self._final_stages:
            return
        if self.length == 0:
            raise GenerationError("final stages need at least one forward pass first")
        n = self._last_tokens.shape[1]
        for stage in self._final_stages:
            self._feed(stage, self._last_tokens, self.length - n, n)
            stage.bound.run()
            stage.joined.clear()
            self._last_run[stage.plan.name] = stage
        self._final_done = True

    def set_input(self, name: str, array: np.ndarray, repeat: int = 1) -> None:
        """A user tensor (``set_model_input`` / ``set_inputs``); init stages that read it rerun.
        ``repeat``: a batched input given per prompt has each row repeated (beam search)."""
        readers = [s for s in self.stages if any(f.name == name for f in s.user_feeds)]
        if not readers:
            known = sorted({f.name for s in self.stages for f in s.user_feeds})
            raise GenerationError(
                f"no stage takes a user input named {name!r} (user inputs: "
                f"{', '.join(known) or '(none)'})"
            )
        for stage in readers:
            feed = next(f for f in stage.user_feeds if f.name == name)
            if repeat > 1 and _batched(stage, feed) and array.shape[0] * repeat == self.batch_size:
                array = np.repeat(array, repeat, axis=0)
            _check_user_tensor(stage, feed, array, self.batch_size)
        # Copied once to the device its readers share (a host tensor bound on a device would
        # be copied on every run); readers on different devices read it from the host.
        devices = {s.bound.device for s in readers}
        device = devices.pop() if len(devices) == 1 else HOST
        self.hold_input(name, device.upload(np.ascontiguousarray(array)))

    def hold_input(self, name: str, value: ort.OrtValue) -> None:
        """A user tensor already checked and placed where its readers read it (an adapter's
        device copy): bound as is from the next pass; init stages that read it rerun."""
        self.user_inputs[name] = value
        if any(s.step.when == "init" for s in self.stages for f in s.user_feeds if f.name == name):
            self._init_done = False

    # -- init phase ------------------------------------------------------------------------

    def _run_init(self, stage: BoundStage, tokens: np.ndarray, start: int, n: int) -> None:
        if stage.step.loop == "per_image":
            self._run_per_image(stage, tokens, start, n)
        else:
            self._feed(stage, tokens, start, n)
            stage.bound.run()
            stage.joined.clear()
        self._last_run[stage.plan.name] = stage
        if self.cross is not None and stage.plan.name == self.cross.layout.source:
            self.cross.capture(stage.bound)

    def _run_per_image(self, stage: BoundStage, tokens: np.ndarray, start: int, n: int) -> None:
        """One run per image (the user inputs' leading axis), outputs joined on axis 0."""
        file = stage.plan.io.file
        arrays = {}
        for feed in stage.user_feeds:
            if feed.name not in self.user_inputs:
                raise GenerationError(
                    f"{file} (loop per_image) needs input {feed.name!r} ({feed.info}): give the "
                    "images with set_inputs / set_model_input"
                )
            arrays[feed.name] = self.user_inputs[feed.name].numpy()
        counts = {name: a.shape[0] if a.ndim else 0 for name, a in arrays.items()}
        if not counts or 0 in counts.values():
            raise GenerationError(
                f"{file} (loop per_image) has no images: inputs {counts or '(none)'} have no "
                "leading image axis to loop over"
            )
        if len(set(counts.values())) > 1:
            raise GenerationError(f"{file} (loop per_image): image counts differ: {counts}")
        pieces: dict[str, list[np.ndarray]] = {name: [] for name in stage.plan.io.outputs}
        saved = {name: self.user_inputs[name] for name in arrays}
        try:
            for i in range(next(iter(counts.values()))):
                for name, array in arrays.items():
                    piece = np.ascontiguousarray(array[i : i + 1])
                    self.user_inputs[name] = ort.OrtValue.ortvalue_from_numpy(piece)
                self._feed(stage, tokens, start, n)
                stage.bound.run()
                for name in pieces:
                    pieces[name].append(stage.bound.output(name).numpy())
        finally:
            self.user_inputs.update(saved)
        stage.joined = {
            name: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(np.concatenate(parts)))
            for name, parts in pieces.items()
        }

    # -- feeding ---------------------------------------------------------------------------

    def _feed(
        self,
        stage: BoundStage,
        tokens: np.ndarray,
        start: int,
        n: int,
        last_only: bool = False,
        decode: bool = False,
    ) -> None:
        bound = stage.bound
        if stage.last_position_switch:
            bound.feed(LAST_POSITION_SWITCH, _SWITCH[last_only])
        for feed in stage.role_feeds:
            role = feed.role
            if role == "input_ids":
                # Rank 1: one token per row (decoders that take [B] ids).
                rows = tokens if feed.info.rank != 1 else tokens[:, -1]
                ids = self._ids_buffer(stage.dtypes[feed.name], rows)
                self._bind(stage, feed.name, ids)
            elif role == "attention_mask" and self._source and stage.step.when == "init":
                self._bind(stage, feed.name, self._cast_mask(feed, self._source_mask))
            elif role == "encoder_attention_mask":
                if self._source_mask is None:
                    raise ModelError(
                        f"{stage.plan.io.file}: input {feed.name!r} (encoder_attention_mask) "
                        "needs an init stage that reads input_ids"
                    )
                self._bind(stage, feed.name, self._cast_mask(feed, self._source_mask))
            elif role == "attention_mask" and feed.info.rank == 4:
                self._bind(stage, feed.name, self._mask4(feed.info.dtype, n))
            elif role == "attention_mask" and decode and self.graph is not None:
                self._bind(stage, feed.name, self._step_positions.static_mask())
            elif role == "attention_mask" and not self.device.host:
                bound.feed_prefix(feed.name, *self._step_positions.mask_buffer())
            elif role == "attention_mask":
                self._bind(stage, feed.name, self._step_positions.mask())
            elif role in ("position_ids", "cache_position"):
                self._bind(stage, feed.name, self._step_positions.positions(n))
            elif role in RECURRENT_ROLES:
                state = self._recurrent.get(feed.name)
                if state is None:
                    state = self._recurrent[feed.name] = self._zeros(stage, feed)
                bound.bind_value(feed.name, state)
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
            bound.bind_value(feed.name, stage_output(source, feed.wire.src_tensor))
        for feed in stage.user_feeds:
            if feed.name not in self.user_inputs:
                raise GenerationError(
                    f"{stage.plan.io.file} needs input {feed.name!r} ({feed.info}), which no "
                    "role, wire or cache provides: set it with set_inputs() / set_model_input()"
                )
            bound.bind_value(feed.name, self.user_inputs[feed.name])
        if stage.has_kv and self.cache is not None:
            self.cache.bind(bound, n)
        if stage.has_cross and self.cross is not None:
            self.cross.bind(bound)
        if stage.plan.logits is not None:
            self.logits.bind(stage, 1 if last_only else n)
        stage.bind_alloc_outputs()

    def _bind(self, stage: BoundStage, name: str, array: np.ndarray) -> None:
        """A per-pass host input, bound where its session reads it (``BoundSession.feed``)."""
        stage.bound.feed(name, array)

    def _mask4(self, dtype: np.dtype, n: int) -> np.ndarray:
        """A ``[B, 1, n, total]`` mask: the 2D padding mask, causal (or the tree's ancestry)
        over this pass's tokens; integer/bool 1 = attend, float additive (0 or the dtype's min)."""
        base = self._step_positions.mask()
        batch, total = base.shape
        floating = np.issubdtype(dtype, np.floating)
        if n == 1 and self._tree is None and not floating and base.dtype == dtype:
            return base.reshape(batch, 1, 1, total)  # a decode step: a view, nothing allocated
        visible = np.repeat((base != 0)[:, None, None, :], n, axis=2)
        within = self._tree.visible if self._tree is not None else np.tri(n, dtype=bool)
        visible[:, 0, :, total - n :] &= within
        if floating:
            return np.where(visible, 0.0, np.finfo(dtype).min).astype(dtype)
        return visible.astype(dtype)

    def keep(self, start: int, offsets: np.ndarray) -> None:
        """After a tree pass: keep the tokens before ``start`` and those at ``start + offsets``
        (one path, in order), moved to consecutive positions; forget the rest."""
        self.cache.compact(start, start + np.asarray(offsets, np.int64))
        self.positions.straighten(start, start + len(offsets))
        self._final_done = False

    def _cast_mask(self, feed, mask: np.ndarray) -> np.ndarray:
        key = (feed.name, mask.__array_interface__["data"][0])
        out = self._masks.get(key)
        if out is None:  # one per source mask and input: kept alive while it is bound
            out = self._masks[key] = np.ascontiguousarray(mask, feed.info.dtype)
        return out

    def _zeros(self, stage: BoundStage, feed) -> ort.OrtValue:
        shape = []
        for dim in feed.info.shape:
            if isinstance(dim, int) and dim >= 0:
                shape.append(dim)
            elif isinstance(dim, str) and "batch" in dim.lower():
                shape.append(self.batch_size)
            else:
                raise ModelError(
                    f"{stage.plan.io.file}: recurrent input {feed.info} has a dimension the "
                    "runtime cannot size for its zero initial state"
                )
        return ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, feed.info.dtype))

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

    def pass_logits(self) -> np.ndarray:
        """Logits ``[B, n, V]`` at every position of the last pass (a view the next pass
        overwrites); speculative verification scores all drafted tokens from one pass."""
        stage = self._logits_stage
        if self._fixed is not None:  # chunked passes: the buffer holds the last chunk only
            raise ModelError(
                f"{stage.plan.io.file}: a {self.cache.kind} cache runs fixed chunks, so one "
                "pass's logits at every position are not kept"
            )
        if stage.plan.logits.rank != 3:
            raise ModelError(
                f"{stage.plan.io.file}: logits {stage.plan.logits} hold the last position only"
            )
        self._every_row_again()
        return self.logits.whole(stage)

    def _every_row_again(self) -> None:
        """The last pass computed each row's last logits only: run it again for every row (a
        caller that wants them passes ``every_row`` and never pays this)."""
        if self._last_position_pass:
            tokens = self._last_tokens
            self.rewind_to(self.length - tokens.shape[1])
            self.run(tokens, every_row=True)

    def output(self, name: str) -> np.ndarray:
        """An output of the last pass, by tensor name (for ``Generator.get_output``)."""
        for stage in self._last_run.values():
            if name not in stage.plan.io.outputs:
                continue
            logits = stage.plan.logits
            if logits is not None and name == logits.name:
                self._every_row_again()  # the reference's get_output holds every position
                if self.logits.last is not None:
                    return self.logits.last.copy()
            return stage_output(stage, name).numpy().copy()
        raise GenerationError(f"no stage has run with an output named {name!r}")


def _kv_device(stages: list[BoundStage]) -> Device:
    """The device of the stages that hold the KV cache (one device for all of them)."""
    devices = {s.bound.device for s in stages if s.has_kv}
    if len(devices) > 1:
        listed = ", ".join(f"{s.plan.io.file} on {s.bound.device}" for s in stages if s.has_kv)
        raise ModelError(f"the stages that share the KV cache run on different devices: {listed}")
    return devices.pop() if devices else HOST


def _batched(stage: BoundStage, feed) -> bool:  # axis 0 named a batch (per-image loops: images)
    first = feed.info.shape[0] if feed.info.shape else None
    return stage.step.loop != "per_image" and isinstance(first, str) and "batch" in first.lower()


def _check_user_tensor(stage: BoundStage, feed, array: np.ndarray, batch: int) -> None:
    """Rank, dtype, fixed dims and a batch axis of the generator's batch size."""
    file, info = stage.plan.io.file, feed.info
    if array.ndim != info.rank:
        raise GenerationError(
            f"{file}: input {feed.name!r} expects rank {info.rank} ({info}), got shape "
            f"{array.shape}"
        )
    if array.dtype != info.dtype:
        raise GenerationError(
            f"{file}: input {feed.name!r} expects {info.dtype} ({info}), got {array.dtype}"
        )
    per_image = stage.step.loop == "per_image"  # the graph sees one image (axis 0) at a time
    for axis, dim in enumerate(info.shape):
        if per_image and axis == 0:
            continue
        if isinstance(dim, int) and dim >= 0 and array.shape[axis] != dim:
            raise GenerationError(
                f"{file}: input {feed.name!r} expects {dim} on axis {axis} ({info}), got shape "
                f"{array.shape}"
            )
    if _batched(stage, feed) and array.shape[0] != batch:
        raise GenerationError(
            f"{file}: input {feed.name!r} has batch {array.shape[0]} on axis 0 but the "
            f"generator's batch_size is {batch}"
        )
