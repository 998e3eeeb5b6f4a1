"""What ``validate`` and ``explain`` run against a model folder: every session loaded (all
failures reported, not just the first), the config matched against the graphs, and a two-token
test run that confirms what the graphs leave symbolic."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config.bounded import clip_text
from ..errors import ConfigError, GenaiRuntimeError
from ..spec import PipelineSpec
from .confirm import config_problems, json_path_of
from .pipeline import LoadedPipeline
from .plan import Plan, graph_problems
from .sessions import load_sessions


@dataclass
class GraphCheck:
    """The outcome of loading every session of a spec and matching the config against it."""

    pipeline: LoadedPipeline | None
    errors: list[str]
    warnings: list[str]

    @property
    def plan(self) -> Plan | None:
        return None if self.pipeline is None else self.pipeline.plan


def check_graphs(spec: PipelineSpec) -> GraphCheck:
    """Load every session (without running it) and list every config/graph mismatch."""
    sessions, ios, failures = load_sessions(spec, spec.sessions)  # every one: report them all
    errors = [str(exc) for exc in failures]
    warnings: list[str] = []
    errors += graph_problems(spec, ios)
    if errors:
        return GraphCheck(None, errors, warnings)
    try:
        pipeline = LoadedPipeline.of(spec, sessions, ios)
    except GenaiRuntimeError as exc:
        return GraphCheck(None, [str(exc)], warnings)
    if pipeline.plan.layout is not None:
        try:
            pipeline.kv_plan()
        except ConfigError as exc:
            errors += [str(p) for p in exc.problems]
        except GenaiRuntimeError as exc:  # the graph is fine; this runtime cannot run it yet
            warnings.append(f"runtime: {exc}")
    errors += [str(p) for p in config_problems(spec, pipeline.plan)]
    if not errors and spec.plugin is None:
        probe_errors, probe_warnings = probe_problems(pipeline)
        errors += probe_errors
        warnings += probe_warnings
    if spec.plugin is not None:
        warnings.append("pipeline.plugin loads code: it runs only with trust_remote_code=True")
    return GraphCheck(pipeline, errors, warnings)


def probe_problems(pipeline: LoadedPipeline) -> tuple[list[str], list[str]]:
    """Run a one-token prompt and one decode step: (errors, warnings).

    A failure is an error when the config sets a cache dimension the graph does not state
    (the likely cause); otherwise a warning, since fixed-shape test graphs fail a probe too.
    """
    spec, plan = pipeline.spec, pipeline.plan
    layout = plan.layout
    if any(f.source == "user" for stage in plan.stages for f in stage.feeds):
        return [], []  # needs inputs only the user gives (images, audio...): nothing to probe
    kv_plan = pipeline.kv_plan()
    batch = (layout.static_batch if layout is not None else None) or 1  # a graph may fix it
    try:
        executor = pipeline.executor(batch, 2)
        executor.forward(np.zeros((batch, 1), np.int32))
        if kv_plan is not None and kv_plan.kind == "concat":
            problems = _present_problems(spec, executor)
            if problems:
                return problems, []
        executor.forward(np.zeros((batch, 1), np.int32))
    except Exception as exc:
        reason = clip_text(str(exc), 400)
        hint = ""
        if layout is not None:
            kv = spec.state.kv_cache
            info = next(
                f.info for st in plan.stages for f in st.feeds if f.name == layout.past[0][0]
            )
            axes = {"separate": (1, 3), "combined": (2, 4)}.get(layout.format, (None, None))
            unconfirmed = [
                f"{json_path_of(spec, key)} = {getattr(kv, key)}"
                for key, axis in zip(("num_kv_heads", "head_size"), axes)
                if getattr(kv, key) is not None and (axis is None or info.static_dim(axis) is None)
            ]
            if unconfirmed:
                hint = f" (check {', '.join(unconfirmed)}: the graph does not state it)"
                return [f"a two-token test run failed{hint}: {reason}"], []
        return [], [f"a two-token test run failed: {reason}"]
    return [], []


def _present_problems(spec: PipelineSpec, executor) -> list[str]:
    """A concat cache's first present tensor against the layout built from the config."""
    cache = executor.cache
    layout = cache.layout
    present = cache.held_shape()  # what the graph just returned as present
    expected = layout.shape(1, 1)
    if list(present) == list(expected):
        return []
    axes = {"separate": (1, 3), "combined": (2, 4)}.get(layout.format)
    if axes is None:
        return []
    problems = []
    for key, axis, value in (
        ("num_kv_heads", axes[0], layout.num_kv_heads),
        ("head_size", axes[1], layout.head_size),
    ):
        if present[axis] != value:
            problems.append(
                f"{json_path_of(spec, key)}: {value} disagrees with the graph: {layout.file} "
                f"returns {layout.present[0][0]!r} with {key} {present[axis]}"
            )
    return problems
