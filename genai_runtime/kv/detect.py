"""Finding a session's self-attention cache in its declared I/O: names, layers, layout, window."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..errors import ConfigError, ConfigProblem, ModelError
from ..session.graph_io import SessionIO, TensorInfo
from ..session.onnx_scan import int_attributes
from ..spec import KVCacheSpec, SessionSpec
from .base import KVLayout

# (past key, past value, present key, present value); value None = combined [2, B, H, S, D].
KNOWN_PATTERNS = (
    ("past_key_values.%d.key", "past_key_values.%d.value", "present.%d.key", "present.%d.value"),
    ("past_%d", None, "present_%d", None),
    ("key_cache.%d", "value_cache.%d", "updated_key_cache.%d", "updated_value_cache.%d"),
    ("past_key.%d", "past_value.%d", "present_key.%d", "present_value.%d"),
)


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
