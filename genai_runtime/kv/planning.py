"""Choosing a cache kind for a detected layout (``plan_cache``) and building it (``make_cache``).

One registry, ``CACHE_KINDS``; ``KVPlan`` carries the kind and the reason ``explain`` shows.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ConfigError, ConfigProblem, ModelError, UnsupportedError
from ..session.device import HOST, Device
from ..spec import KVCacheSpec
from .base import KVCache, KVCacheBase, KVLayout
from .concat import ConcatCache
from .drivers import DriverFed
from .fixed_shape import StaticFifoCache, StaticIndexCopyCache
from .graph_scattered import GraphScatteredCache
from .share_buffer import ShareBufferCache
from .sliding_window import SlidingWindowCache
from .static_scatter import StaticScatterCache

if TYPE_CHECKING:
    from ..session.positions import PositionState

CACHE_KINDS: dict[str, type[KVCacheBase]] = {
    "concat": ConcatCache,
    "share-buffer": ShareBufferCache,
    "static-scatter": StaticScatterCache,
    "sliding-window": SlidingWindowCache,
    "graph-scattered": GraphScatteredCache,
    "static-index-copy": StaticIndexCopyCache,
    "static-fifo": StaticFifoCache,
}

# The kinds for graphs that return only a fixed chunk's new rows (the runtime writes them).
FIXED_SHAPE_KINDS = ("static-index-copy", "static-fifo")


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
        formats = CACHE_KINDS[kv.kind].formats
        if layout.format not in formats:
            raise ConfigError(
                [ConfigProblem("pipeline.state.kv_cache.kind",
                               f"{kv.kind} needs {' or '.join(formats)} caches; "
                               f"{layout.file} declares the {layout.format} layout")]
            )  # fmt: skip
        fixed_kinds = FIXED_SHAPE_KINDS
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


def device_obstacle(kind: str, device: Device) -> str | None:
    """Why a cache of ``kind`` cannot hold its keys/values on ``device`` (None: it can)."""
    if device.host or CACHE_KINDS[kind].on_device:
        return None
    able = ", ".join(k for k, c in CACHE_KINDS.items() if c.on_device)
    return (
        f"a {kind} cache moves its keys/values with host code, so it cannot live on {device} "
        f"(kinds that run on a device: {able}); run this model on the CPU provider"
    )


def make_cache(
    plan: KVPlan,
    batch_size: int,
    max_length: int,
    positions: PositionState | None = None,
    device: Device = HOST,
) -> KVCache:
    layout = plan.layout
    if layout.static_batch is not None and layout.static_batch != batch_size:
        raise ModelError(
            f"{layout.file}: KV input {layout.past[0][0]!r} fixes batch size "
            f"{layout.static_batch}; batch_size {batch_size} cannot run on it"
        )
    why = device_obstacle(plan.kind, device)
    if why is not None:
        raise UnsupportedError(f"{layout.file}: {why}")
    cls = CACHE_KINDS[plan.kind]
    if cls.uses_positions and cls.on_device:
        return cls(layout, batch_size, max_length, positions=positions, device=device)
    if cls.uses_positions:
        return cls(layout, batch_size, max_length, positions=positions)
    if cls.on_device:
        cache = cls(layout, batch_size, max_length, device=device)
    else:
        cache = cls(layout, batch_size, max_length)
    if layout.drivers and positions is not None:
        return DriverFed(cache, batch_size, positions)
    return cache
