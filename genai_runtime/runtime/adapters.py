"""LoRA adapters in onnxruntime's adapter format (``.onnx_adapter``): read, checked against the
graphs they feed, bound to an executor.

An adapter is a set of named tensors that replace graph inputs of the same names: onnxruntime's
overridable initializers (inputs with a default, the base model's weights when no adapter is
active) or inputs nothing else feeds. onnxruntime applies adapters through
``RunOptions.add_active_adapter``, which its IOBinding path ignores (1.31 logs "won't have an
effect"), so the tensors are bound as inputs, once per executor.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import onnxruntime as ort

from ..errors import GenerationError, ModelError
from ..session.device import Device
from ..session.graph_io import TensorInfo
from .executor import Executor
from .plan import StagePlan


@dataclass(frozen=True, eq=False)
class AdapterFile:
    """One adapter file's tensors (zero-copy views of the file onnxruntime read)."""

    path: str
    tensors: Mapping[str, ort.OrtValue]
    infos: Mapping[str, TensorInfo]


@dataclass(frozen=True)
class Target:
    """A graph input an adapter tensor may replace."""

    stage: str
    file: str
    info: TensorInfo
    overridable: bool  # has a default in the graph (else nothing feeds it without an adapter)


def read_adapter(path: str | os.PathLike) -> AdapterFile:
    """Read an ``.onnx_adapter`` file; a missing or malformed file raises ModelError naming it."""
    if not isinstance(path, str | os.PathLike):
        raise GenerationError(f"adapter path: expected a file path, got {type(path).__name__}")
    shown = os.fspath(path)
    if not Path(shown).is_file():
        raise ModelError(f"adapter file not found: {shown}")
    try:
        tensors = dict(ort.AdapterFormat.read_adapter(shown).get_parameters())
    except Exception as exc:  # onnxruntime's RuntimeError for a buffer it cannot parse
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{shown}: not an onnxruntime adapter file ({reason})") from exc
    if not tensors:
        raise ModelError(f"{shown}: the adapter holds no tensors")
    infos = {
        name: TensorInfo(name, value.data_type(), tuple(value.shape()))
        for name, value in tensors.items()
    }
    return AdapterFile(shown, MappingProxyType(tensors), MappingProxyType(infos))


def adapter_targets(
    stages: Iterable[tuple[StagePlan, ort.InferenceSession]],
) -> dict[str, list[Target]]:
    """Every input an adapter may replace, by name: overridable initializers, and inputs that
    no role, wire or cache feeds."""
    out: dict[str, list[Target]] = {}
    for plan, session in stages:
        for arg in session.get_overridable_initializers():
            info = TensorInfo(arg.name, arg.type, tuple(arg.shape))
            out.setdefault(arg.name, []).append(Target(plan.name, plan.io.file, info, True))
        for feed in plan.feeds_from("user"):
            target = Target(plan.name, plan.io.file, feed.info, False)
            out.setdefault(feed.name, []).append(target)
    return out


def check_adapter(adapter: AdapterFile, targets: Mapping[str, list[Target]]) -> None:
    """Each tensor must name an input of the graphs with the same element type and shape."""
    for name, info in adapter.infos.items():
        places = targets.get(name)
        if not places:
            known = ", ".join(sorted(targets)[:12]) or "(none)"
            raise ModelError(
                f"{adapter.path}: adapter tensor {info} matches no input of the model's graphs "
                f"(inputs an adapter can set: {known})"
            )
        for place in places:
            if not _fits(info, place.info):
                raise ModelError(
                    f"{adapter.path}: adapter tensor {info} does not fit {place.file}'s input "
                    f"{place.info}"
                )


# Per adapter file, its tensors copied to each device that reads them: made once, so a
# generator on a device binds device memory (a host tensor bound there is copied every run).
_ON_DEVICE: weakref.WeakKeyDictionary[AdapterFile, dict[tuple[Device, str], ort.OrtValue]] = (
    weakref.WeakKeyDictionary()
)
_ON_DEVICE_LOCK = threading.Lock()


def _tensor_on(adapter: AdapterFile, name: str, device: Device) -> ort.OrtValue:
    """``adapter``'s tensor ``name`` where ``device`` reads it (its own memory on the host)."""
    value = adapter.tensors[name]
    if device.host:
        return value
    with _ON_DEVICE_LOCK:
        copies = _ON_DEVICE.setdefault(adapter, {})
        if (device, name) not in copies:
            copies[(device, name)] = device.upload(value.numpy())
        return copies[(device, name)]


def bind_adapter(executor: Executor, adapter: AdapterFile) -> None:
    """Bind the adapter's tensors on every stage that takes them; they stay bound for the
    executor's life (an input with a default by pointer, an unfed input as a user input). On
    a device they are bound from device copies made once per adapter file."""
    stages = [(stage.plan, stage.bound.session) for stage in executor.stages]
    targets = adapter_targets(stages)
    check_adapter(adapter, targets)
    by_stage = {stage.plan.name: stage for stage in executor.stages}
    for name in adapter.tensors:
        for place in targets[name]:
            bound = by_stage[place.stage].bound
            value = _tensor_on(adapter, name, bound.device)
            if place.overridable:
                bound.bind_value(name, value)
            elif executor.user_inputs.get(name) is not value:
                executor.hold_input(name, value)


def _fits(have: TensorInfo, want: TensorInfo) -> bool:
    if have.type != want.type or have.rank != want.rank:
        return False
    return all(
        not isinstance(dim, int) or dim < 0 or dim == got
        for dim, got in zip(want.shape, have.shape)
    )
