"""KV caches: one registry of kinds, and detection of the layout from a graph's declared I/O."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..config.spec import KVCacheSpec, SessionSpec
from ..errors import ConfigError, ConfigProblem, ModelError
from ..runtime.graph_io import SessionIO, TensorInfo
from ..runtime.onnx_scan import int_attributes
from .base import KVCache, KVLayout
from .concat import ConcatCache
from .drivers import DriverFed
from .fixed_shape import StaticFifoCache, StaticIndexCopyCache
from .graph_scattered import GraphScatteredCache
from .share_buffer import ShareBufferCache
from .sliding_window import SlidingWindowCache
from .static_scatter import StaticScatterCache

if TYPE_CHECKING:
    from ..runtime.positions import PositionState

CACHE_KINDS: dict[str, type] = {
    "concat": ConcatCache,
    "share-buffer": ShareBufferCache,
    "static-scatter": StaticScatterCache,
    "sliding-window": SlidingWindowCache,
    "graph-scattered": GraphScatteredCache,
    "static-index-copy": StaticIndexCopyCache,
    "static-fifo": StaticFifoCache,
}
# The layout each kind can hold (what "kind" may force on a graph).
_KIND_FORMATS = {
    "concat": ("separate", "combined"),
    "share-buffer": ("separate",),
    "static-scatter": ("scatter",),
    "sliding-window": ("separate",),
    "graph-scattered": ("separate",),
    "static-index-copy": ("separate",),
    "static-fifo": ("separate",),
}

# (past key, past value, present key, present value); value None = combined [2, B, H, S, D].
KNOWN_PATTERNS = (
    ("past_key_values.%d.key", "past_key_values.%d.value", "present.%d.key", "present.%d.value"),
    ("past_%d", None, "present_%d", None),
    ("key_cache.%d", "value_cache.%d", "updated_key_cache.%d", "updated_value_cache.%d"),
    ("past_key.%d", "past_value.%d", "present_key.%d", "present_value.%d"),
)

__all__ = [
    "CACHE_KINDS",
    "KNOWN_PATTERNS",
    "KVCache",
    "KVLayout",
    "KVPlan",
    "configured_kv_pattern",
    "detect_layout",
    "make_cache",
    "plan_cache",
]


def _configured_patterns(kv: KVCacheSpec, session: SessionSpec) -> tuple | None:
    ins, outs = session.inputs, session.outputs
    if kv.past_key_pattern:
        if kv.format == "combined":
            return (kv.past_key_pattern, None, kv.present_key_pattern, None)
        return (kv.past_key_pattern, kv.past_value_pattern, kv.present_key_pattern,
                kv.present_value_pattern)  # fmt: skip
    if "past_names" in ins:
        return (ins["past_names"], None, outs.get("present_names"), None)
    if "past_key_names" in ins:
        return (ins["past_key_names"], ins.get("past_value_names"),
                outs.get("present_key_names"), outs.get("present_value_names"))  # fmt: skip
    return None


def _layers(pattern: str, names: Mapping[str, TensorInfo]) -> int:
    if "%d" not in pattern:  # one name for every layer cannot be counted (or told apart)
        raise ConfigError(
            [ConfigProblem("pipeline.state.kv_cache", f"KV name pattern {pattern!r} has no %d")]
        )
    count = 0
    while pattern.replace("%d", str(count)) in names:
        count += 1
    return count


def detect_layout(io: SessionIO, kv: KVCacheSpec, session: SessionSpec) -> KVLayout | None:
    """Find the self-attention cache a session declares, or None if it declares none.

    Names come from the config when it gives them, else from the conventional patterns.
    """
    configured = _configured_patterns(kv, session)
    for past_k, past_v, present_k, present_v in [configured] if configured else KNOWN_PATTERNS:
        layers = _layers(past_k, io.inputs)
        if layers:
            return _layout(io, kv, session, past_k, past_v, present_k, present_v, layers)
    return None


def configured_kv_pattern(kv: KVCacheSpec, session: SessionSpec) -> str | None:
    """The past-key pattern a config names explicitly for this session, if any."""
    configured = _configured_patterns(kv, session)
    return configured[0] if configured else None


def _layout(io, kv, session, past_k, past_v, present_k, present_v, layers) -> KVLayout:
    combined = past_v is None
    present_k = present_k or ("present_%d" if combined else "present.%d.key")
    present_v = None if combined else (present_v or "present.%d.value")
    past, present = [], []
    for i in range(layers):
        p = (past_k % i,) if combined else (past_k % i, past_v % i)
        q = (present_k % i,) if combined else (present_k % i, present_v % i)
        for name in p:
            if name not in io.inputs:
                raise ModelError(f"{io.file}: KV input {name!r} missing for layer {i}")
        for name in q:
            if name not in io.outputs:
                raise ModelError(
                    f"{io.file}: KV output {name!r} missing for layer {i} "
                    f"(pattern {present_k!r}; graph outputs: {', '.join(io.outputs)})"
                )
        past.append(p)
        present.append(q)
    if kv.num_layers is not None and kv.num_layers != layers:
        raise ModelError(
            f"{io.file}: the config says {kv.num_layers} layers but the graph declares {layers} "
            f"past inputs matching {past_k!r}"
        )
    info = io.inputs[past[0][0]]
    fmt = {5: "combined", 4: "separate", 3: "scatter"}.get(info.rank)
    if fmt is None or (fmt == "combined") != combined:
        raise ModelError(f"{io.file}: KV input {info} has an unsupported rank {info.rank}")
    heads_axis, size_axis = {"combined": (2, 4), "separate": (1, 3), "scatter": (None, 2)}[fmt]
    capacity = info.static_dim(1) if fmt == "scatter" else None
    new_rows = None
    if fmt == "separate" and info.static_dim(2):
        # A fixed context: returned whole (the graph scatters into it), or only the new rows
        # of a fixed chunk (the runtime writes them: fixed-shape caches).
        out_info = io.outputs[present[0][0]]
        fixed, out_rows = info.static_dim(2), out_info.static_dim(2)
        if out_info.rank == 4 and out_rows == fixed:
            capacity = fixed
        elif out_info.rank == 4 and out_rows:
            capacity, new_rows = fixed, out_rows
        elif out_info.rank == 4:
            raise ModelError(
                f"{io.file}: KV input {info} fixes the context at {fixed} but output "
                f"{out_info} does not fix its rows: neither the whole cache nor a fixed chunk"
            )
    hidden_sizes: tuple[int, ...] = ()
    if fmt == "scatter":
        hidden_sizes = _scatter_hidden(io, kv, past)
        heads = kv.num_kv_heads or 1
        size = kv.head_size or hidden_sizes[0] // heads
    else:
        heads = _dim(info, heads_axis, kv.num_kv_heads, "num_kv_heads", io.file)
        size = _dim(info, size_axis, kv.head_size, "head_size", io.file)
    if heads is None or size is None:
        missing = "num_kv_heads" if heads is None else "head_size"
        raise ModelError(
            f"{io.file}: KV input {info} does not state its {missing} and the config does not "
            f"give it; set pipeline.state.kv_cache.{missing}"
        )
    window = kv.sliding_window
    win, win_layers = (window.window_size, window.layers) if window else (None, ())
    if window is None and fmt == "separate":
        win, win_layers = _graph_window(io, past)
    return KVLayout(
        format=fmt,
        past=tuple(past),
        present=tuple(present),
        dtype=info.dtype,
        num_kv_heads=heads,
        head_size=size,
        pattern=past_k,
        file=io.file,
        static_capacity=capacity,
        static_batch=info.static_dim(1 if combined else 0),
        hidden_sizes=hidden_sizes,
        drivers=_drivers(io, kv, session),
        window=win,
        window_layers=win_layers,
        window_slack=window.cache_slack if window else 0,
        new_rows=new_rows,
        cache_position=_cache_position(io, session),
    )


def _graph_window(io: SessionIO, past: list) -> tuple[int | None, tuple[int, ...]]:
    """The sliding window the graph's GroupQueryAttention nodes state (``local_window_size``)
    when the config gives none: the window, and the layers using it (empty: all of them)."""
    if io.path is None:
        return None, ()
    layer_of = {names[0]: i for i, names in enumerate(past)}
    windows = {}
    for inputs, size in int_attributes(Path(io.path), "GroupQueryAttention", "local_window_size"):
        if size > 0 and len(inputs) > 3 and inputs[3] in layer_of:  # input 3: past_key
            windows[layer_of[inputs[3]]] = size
    if not windows:
        return None, ()
    layers = tuple(sorted(windows))
    return max(windows.values()), (() if len(layers) == len(past) else layers)


def _cache_position(io: SessionIO, session: SessionSpec) -> str | None:
    name = session.inputs.get("cache_position") or "cache_position"
    return name if name in io.inputs else None


# Per-row int64 [batch] inputs a cache feeds itself, by role (their default tensor names).
DRIVER_ROLES = ("write_indices", "nonpad_kv_seqlen")


def _drivers(io: SessionIO, kv: KVCacheSpec, session: SessionSpec) -> tuple[tuple[str, str], ...]:
    found = []
    for role in DRIVER_ROLES:
        name = getattr(kv, role) or session.inputs.get(role) or role
        if name in io.inputs:
            found.append((role, name))
    return tuple(found)


def _scatter_hidden(io: SessionIO, kv: KVCacheSpec, past: list) -> tuple[int, ...]:
    """Each past tensor's kv_hidden ([B, S, kv_hidden]), checked against the config's heads.

    Layers may differ (e.g. wider global layers); then only head_size must divide each one.
    """
    infos = [io.inputs[name] for names in past for name in names]
    for info in infos:
        if info.static_dim(1) is None or info.static_dim(2) is None:
            raise ModelError(
                f"{io.file}: static-scatter KV input {info} must fix its sequence and kv_hidden "
                "dimensions"
            )
    sizes = tuple(info.static_dim(2) for info in infos)
    expected = kv.num_kv_heads * kv.head_size if kv.num_kv_heads and kv.head_size else None
    for info, hidden in zip(infos, sizes):
        if expected is not None and len(set(sizes)) == 1 and hidden != expected:
            raise ModelError(
                f"{io.file}: KV input {info} has kv_hidden {hidden} but the config says "
                f"num_kv_heads {kv.num_kv_heads} x head_size {kv.head_size} = {expected}"
            )
        if kv.head_size and hidden % kv.head_size:
            raise ModelError(
                f"{io.file}: KV input {info} has kv_hidden {hidden}, not a multiple of the "
                f"config's head_size {kv.head_size}"
            )
    return sizes


def _dim(info: TensorInfo, axis: int, configured: int | None, key: str, file: str) -> int | None:
    graph = info.static_dim(axis)
    if graph is not None and configured is not None and graph != configured:
        raise ModelError(
            f"{file}: KV input {info} has {key} {graph} but the config says {configured}"
        )
    return graph if graph is not None else configured


@dataclass(frozen=True)
class KVPlan:
    """The cache kind chosen for a layout, with the reason (shown by ``explain``)."""

    kind: str
    layout: KVLayout
    reason: str


def plan_cache(layout: KVLayout, kv: KVCacheSpec, share_buffer: bool) -> KVPlan:
    if kv.kind != "auto":
        if kv.kind not in CACHE_KINDS:
            valid = ", ".join(sorted(CACHE_KINDS))
            raise ConfigError(
                [ConfigProblem("pipeline.state.kv_cache.kind",
                               f"unknown cache kind {kv.kind!r} (expected one of: auto, {valid})")]
            )  # fmt: skip
        formats = _KIND_FORMATS.get(kv.kind)
        if formats and layout.format not in formats:
            raise ConfigError(
                [ConfigProblem("pipeline.state.kv_cache.kind",
                               f"{kv.kind} needs {' or '.join(formats)} caches; "
                               f"{layout.file} declares the {layout.format} layout")]
            )  # fmt: skip
        fixed_kinds = ("static-index-copy", "static-fifo")
        if (kv.kind in fixed_kinds) != bool(layout.new_rows):
            what = (
                f"a past fixed at {layout.static_capacity} positions with {layout.new_rows} new "
                "rows out"
                if layout.new_rows
                else "a past without a fixed context plus fixed new rows"
            )
            raise ConfigError(
                [ConfigProblem("pipeline.state.kv_cache.kind",
                               f"{kv.kind} does not fit {layout.file}, which declares {what} "
                               f"(fixed-shape kinds: {', '.join(fixed_kinds)})")]
            )  # fmt: skip
        if kv.kind == "sliding-window" and not layout.window:
            raise ConfigError(
                [ConfigProblem("pipeline.state.kv_cache.sliding_window",
                               "kind sliding-window needs sliding_window.window_size")]
            )  # fmt: skip
        return KVPlan(kv.kind, layout, "set by pipeline.state.kv_cache.kind")
    if kv.num_kv_blocks and layout.static_capacity and layout.static_capacity % kv.num_kv_blocks:
        raise ConfigError(
            [ConfigProblem("pipeline.state.kv_cache.num_kv_blocks",
                           f"{kv.num_kv_blocks} KV blocks do not divide the context length "
                           f"{layout.static_capacity} that {layout.file} fixes")]
        )  # fmt: skip
    plan = _auto_plan(layout, share_buffer)
    if layout.drivers and plan.kind != "static-scatter":
        names = ", ".join(name for _, name in layout.drivers)
        warnings.warn(
            f"{layout.file}: the graph takes static-scatter inputs ({names}) but its KV caches "
            f"are {layout.format}, not [B, S, kv_hidden]: using the generic {plan.kind} cache "
            "and feeding those inputs the valid lengths before/after each pass",
            RuntimeWarning,
            stacklevel=2,
        )
        plan = KVPlan(plan.kind, layout, plan.reason + "; static-scatter inputs fed generically")
    return plan


def _auto_plan(layout: KVLayout, share_buffer: bool) -> KVPlan:
    if layout.format == "scatter":
        return KVPlan(
            "static-scatter",
            layout,
            f"3-D [B, {layout.static_capacity}, kv_hidden] caches with write_indices / "
            "nonpad_kv_seqlen: the graph scatters into them in place",
        )
    if layout.new_rows and layout.cache_position:
        return KVPlan(
            "static-index-copy",
            layout,
            f"past fixed at {layout.static_capacity} positions, {layout.new_rows} new rows out, "
            f"and a {layout.cache_position!r} input: the runtime writes each row at its slot "
            "(left-aligned mask, right-padded chunks)",
        )
    if layout.new_rows:
        return KVPlan(
            "static-fifo",
            layout,
            f"past fixed at {layout.static_capacity} positions, {layout.new_rows} new rows out, "
            "no cache_position input: the runtime slides the rows in FIFO order (right-aligned "
            "mask, left-padded chunks)",
        )
    if layout.format == "separate" and layout.static_capacity:
        return KVPlan(
            "graph-scattered",
            layout,
            f"past and present both fixed at {layout.static_capacity} positions: the graph "
            "scatters new rows at position_ids and returns the whole cache",
        )
    if layout.format == "separate" and share_buffer and layout.window:
        which = f"layers {list(layout.window_layers)}" if layout.window_layers else "all layers"
        return KVPlan(
            "sliding-window",
            layout,
            f"past_present_share_buffer with a {layout.window}-token sliding window on {which}: "
            "those keep window + slack rows, GroupQueryAttention evicts in place",
        )
    if layout.format == "separate" and share_buffer:
        return KVPlan("share-buffer", layout, "separate caches and past_present_share_buffer")
    if layout.format == "combined" and share_buffer:
        return KVPlan("concat", layout, "combined layout cannot share past/present buffers")
    return KVPlan("concat", layout, f"{layout.format} caches, past_present_share_buffer off")


def make_cache(
    plan: KVPlan, batch_size: int, max_length: int, positions: PositionState | None = None
) -> KVCache:
    layout = plan.layout
    if layout.static_batch is not None and layout.static_batch != batch_size:
        raise ModelError(
            f"{layout.file}: KV input {layout.past[0][0]!r} fixes batch size "
            f"{layout.static_batch}; batch_size {batch_size} cannot run on it"
        )
    cls = CACHE_KINDS[plan.kind]
    if getattr(cls, "uses_positions", False):
        return cls(layout, batch_size, max_length, positions=positions)
    cache = cls(layout, batch_size, max_length)
    if layout.drivers and positions is not None:
        return DriverFed(cache, batch_size, positions)
    return cache
