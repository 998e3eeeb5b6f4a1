"""CUDA graph capture and replay of decode steps (the folder's ``enable_cuda_graph``).

onnxruntime's CUDA provider captures a run whose ``gpu_graph_id`` run option names a graph it
has not seen, and replays that graph for later runs with the same id: kernels, shapes and
device addresses are fixed at capture. So a decode step is captured only when every input and
output stays at one address with one shape from step to step: ids, positions and the whole
``[B, max_length]`` mask staged in device tensors updated in place, the share-buffer KV tensors,
a preallocated logits tensor. Each executor holds its own tensors, so it takes its own graph id;
prompt passes (any length) run with id -1, uncaptured.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import onnxruntime as ort

from ..errors import first_line
from ..session.device import Device
from .plan import RECURRENT_ROLES, StagePlan
from .stage import BoundStage, alloc_outputs


class GraphHost(Protocol):
    """What graph setup reads and writes of an executor."""

    stages: list[BoundStage]
    cache: Any
    graph_note: str


OPTION = "enable_cuda_graph"
_ids = itertools.count(1)  # graph ids are per session; unique per process keeps them apart
_ids_lock = threading.Lock()


def graph_requested(session: ort.InferenceSession) -> bool:
    """Whether the session was made with the CUDA provider's graph option on."""
    options = session.get_provider_options().get("CUDAExecutionProvider", {})
    return str(options.get(OPTION, "0")).lower() in ("1", "true")


def graph_obstacle(
    plans: list[StagePlan],
    sessions: Mapping[str, ort.InferenceSession],
    cache_kind: str | None,
    static_mask: bool,
) -> str | None:
    """Why the decode steps of these stages cannot be captured (None: they can). Read from
    the plan, so ``explain`` says it before any generation."""
    steps = [p for p in plans if p.step.when == "step" and p.step.run_on_token_gen]
    devices = {Device.of(sessions[p.name]) for p in steps}
    if len(devices) != 1 or next(iter(devices)).kind != "cuda":
        return f"decode steps run on {', '.join(sorted(map(str, devices)))}, not one CUDA device"
    for plan in steps:
        file = plan.io.file
        if not graph_requested(sessions[plan.name]):
            return f"{file}'s session does not have enable_cuda_graph on"
        if (
            plan.feeds_from("wire")
            or plan.feeds_from("user")
            or any(f.role in RECURRENT_ROLES for f in plan.feeds_from("role"))
        ):
            return f"{file} takes wired, user or recurrent inputs, reallocated per pass"
        if alloc_outputs(plan):
            return f"{file} has outputs sized per pass ({', '.join(alloc_outputs(plan))})"
    if not static_mask:
        return f"a {cache_kind or 'cache-less'} pass changes its input shapes every step"
    return None


@dataclass(frozen=True)
class CudaGraphs:
    graph_id: int  # the ``gpu_graph_id`` this executor's decode steps capture under

    @classmethod
    def setup(cls, executor: GraphHost, static_mask: bool) -> CudaGraphs | None:
        """Graph replay for this executor's decode steps when their sessions ask for it and
        nothing stops it; the reason otherwise (``executor.graph_note``). Sessions with the
        option on run every uncaptured pass with ``gpu_graph_id`` -1."""
        asked = [s for s in executor.stages if graph_requested(s.bound.session)]
        if not asked:
            executor.graph_note = "off (enable_cuda_graph is not set)"
            return None
        for stage in asked:
            stage.bound.run_options.add_run_config_entry("gpu_graph_id", "-1")
        sessions = {s.plan.name: s.bound.session for s in executor.stages}
        kind = executor.cache.kind if executor.cache is not None else None
        plans = [s.plan for s in executor.stages]
        obstacle = graph_obstacle(plans, sessions, kind, static_mask)
        if obstacle is not None:
            executor.graph_note = f"off: {obstacle}"
            return None
        with _ids_lock:
            graph_id = next(_ids)
        for stage in executor.stages:
            if not (stage.step.when == "step" and stage.step.run_on_token_gen):
                continue
            options = ort.RunOptions()
            options.add_run_config_entry("gpu_graph_id", str(graph_id))
            stage.bound.graph_options = options
        executor.graph_note = (
            f"on: decode steps captured once and replayed (gpu_graph_id {graph_id})"
        )
        return cls(graph_id)

    def failed(self, executor: GraphHost, error: Exception) -> None:
        """A capture or replay that onnxruntime refused: decode uncaptured from now on."""
        reason = first_line(error)
        executor.graph_note = f"off: capture failed ({reason}); decoding uncaptured"
        for stage in executor.stages:
            stage.bound.graph_options = None
