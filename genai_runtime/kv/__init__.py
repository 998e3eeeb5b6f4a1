"""KV caches: one registry of kinds, and detection of the layout from a graph's declared I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..config.spec import KVCacheSpec, SessionSpec
from ..errors import ConfigError, ConfigProblem, ModelError, UnsupportedError
from ..runtime.graph_io import SessionIO, TensorInfo
from .base import KVCache, KVLayout
from .concat import ConcatCache
from .share_buffer import ShareBufferCache

CACHE_KINDS: dict[str, type] = {
    "concat": ConcatCache,
    "share-buffer": ShareBufferCache,
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
            return _layout(io, kv, past_k, past_v, present_k, present_v, layers)
    return None


def configured_kv_pattern(kv: KVCacheSpec, session: SessionSpec) -> str | None:
    """The past-key pattern a config names explicitly for this session, if any."""
    configured = _configured_patterns(kv, session)
    return configured[0] if configured else None


def _layout(io, kv, past_k, past_v, present_k, present_v, layers) -> KVLayout:
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
    if fmt == "scatter":
        hidden = info.static_dim(2)
        heads = kv.num_kv_heads or 1
        size = kv.head_size or (hidden // heads if hidden else None)
    else:
        heads = _dim(info, heads_axis, kv.num_kv_heads, "num_kv_heads", io.file)
        size = _dim(info, size_axis, kv.head_size, "head_size", io.file)
    if heads is None or size is None:
        missing = "num_kv_heads" if heads is None else "head_size"
        raise ModelError(
            f"{io.file}: KV input {info} does not state its {missing} and the config does not "
            f"give it; set pipeline.state.kv_cache.{missing}"
        )
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
    )


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
        if kv.kind == "share-buffer" and layout.format != "separate":
            raise ConfigError(
                [ConfigProblem("pipeline.state.kv_cache.kind",
                               f"share-buffer needs separate [B, H, S, D] caches; "
                               f"{layout.file} declares the {layout.format} layout")]
            )  # fmt: skip
        return KVPlan(kv.kind, layout, "set by pipeline.state.kv_cache.kind")
    if layout.format == "separate" and share_buffer:
        return KVPlan("share-buffer", layout, "separate caches and past_present_share_buffer")
    if layout.format == "combined" and share_buffer:
        return KVPlan("concat", layout, "combined layout cannot share past/present buffers")
    if layout.format == "scatter":
        raise UnsupportedError(f"{layout.file}: static-scatter KV caches are not supported yet")
    return KVPlan("concat", layout, f"{layout.format} caches, past_present_share_buffer off")


def make_cache(plan: KVPlan, batch_size: int, max_length: int) -> KVCache:
    return CACHE_KINDS[plan.kind](plan.layout, batch_size, max_length)
