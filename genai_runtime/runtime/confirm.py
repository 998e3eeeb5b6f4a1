"""What the loaded graphs (and a one-token test run) confirm about a config.

``config_problems`` is cheap (graph declarations only) and runs at every ``Model(...)``: token
ids outside the logits' vocabulary and a ``vocab_size`` that disagrees with the graph are
``ConfigError``s at their JSON path. ``probe_problems`` runs the model once on two tokens, for
``validate``: it is the only way to confirm dimensions a graph leaves symbolic (``head_size``).
``check_graphs`` is what ``validate`` and ``explain`` run: every session loaded, every mismatch
listed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from ..config.bounded import clip_text
from ..config.spec import PipelineSpec
from ..errors import ConfigError, ConfigProblem, GenaiRuntimeError
from .plan import Plan, build_plan, graph_problems
from .sessions import load_sessions

# Where each fact sits in the source document, by config version.
_PATHS = {
    1: {
        "vocab_size": "model.vocab_size",
        "eos": "model.eos_token_id",
        "bos": "model.bos_token_id",
        "pad": "model.pad_token_id",
        "head_size": "model.decoder.head_size",
        "num_kv_heads": "model.decoder.num_key_value_heads",
    },
    2: {
        "vocab_size": "metadata.vocab_size",
        "eos": "tokens.eos",
        "bos": "tokens.bos",
        "pad": "tokens.pad",
        "head_size": "pipeline.state.kv_cache.head_size",
        "num_kv_heads": "pipeline.state.kv_cache.num_kv_heads",
    },
}


def json_path_of(spec: PipelineSpec, fact: str) -> str:
    return _PATHS.get(spec.source_version, _PATHS[2])[fact]


def graph_vocab(plan: Plan) -> tuple[int | None, str | None]:
    """The vocabulary size the logits output declares (None when symbolic), and its file."""
    for stage in plan.stages:
        if stage.logits is not None:
            return stage.logits.static_dim(stage.logits.rank - 1), stage.io.file
    return None, None


def config_problems(spec: PipelineSpec, plan: Plan) -> list[ConfigProblem]:
    """Config facts the graphs contradict: vocab_size, and eos/bos/pad ids past the vocabulary."""
    problems = []
    vocab, file = graph_vocab(plan)
    declared = spec.model.vocab_size
    if vocab is not None and declared is not None and declared != vocab:
        problems.append(
            ConfigProblem(
                json_path_of(spec, "vocab_size"),
                f"{declared} disagrees with the graph: {file} declares logits over {vocab} tokens",
            )
        )
    if vocab is None:
        return problems
    tokens = spec.tokens
    eos_path = json_path_of(spec, "eos")
    ids = [(eos_path if len(tokens.eos) == 1 else f"{eos_path}[{i}]", t)
           for i, t in enumerate(tokens.eos)]  # fmt: skip
    ids += [(json_path_of(spec, "bos"), tokens.bos), (json_path_of(spec, "pad"), tokens.pad)]
    for path, token in ids:
        if token is not None and token >= vocab:
            problems.append(
                ConfigProblem(
                    path,
                    f"token id {token} is outside the vocabulary: {file} declares logits over "
                    f"{vocab} tokens (ids 0..{vocab - 1})",
                )
            )
    return problems


def probe_problems(
    spec: PipelineSpec, plan: Plan, sessions: Mapping[str, ort.InferenceSession]
) -> tuple[list[str], list[str]]:
    """Run a one-token prompt and one decode step: (errors, warnings).

    A failure is an error when the config sets a cache dimension the graph does not state
    (the likely cause); otherwise a warning, since fixed-shape test graphs fail a probe too.
    """
    from ..kv import plan_cache
    from .executor import Executor

    layout = plan.layout
    if any(f.source == "user" for stage in plan.stages for f in stage.feeds):
        return [], []  # needs inputs only the user gives (images, audio...): nothing to probe
    kv_plan = None
    if layout is not None:
        kv_plan = plan_cache(layout, spec.state.kv_cache, spec.generation.past_present_share_buffer)
    try:
        executor = Executor(
            plan, sessions, kv_plan, batch_size=1, max_length=2, pad_token_id=spec.tokens.pad
        )
        executor.forward(np.zeros((1, 1), np.int32))
        if kv_plan is not None and kv_plan.kind == "concat":
            problems = _present_problems(spec, executor)
            if problems:
                return problems, []
        executor.forward(np.zeros((1, 1), np.int32))
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
    present = cache._past[0].shape()  # what the graph just returned as present
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


@dataclass
class GraphCheck:
    """The outcome of loading every session of a spec and matching the config against it."""

    plan: Plan | None
    errors: list[str]
    warnings: list[str]


def check_graphs(spec: PipelineSpec) -> GraphCheck:
    """Load every session (without running it) and list every config/graph mismatch."""
    from ..kv import plan_cache

    sessions, ios, failures = load_sessions(spec, spec.sessions)  # every one: report them all
    errors = [str(exc) for exc in failures]
    warnings: list[str] = []
    errors += graph_problems(spec, ios)
    if errors:
        return GraphCheck(None, errors, warnings)
    try:
        plan = build_plan(spec, ios)
    except GenaiRuntimeError as exc:
        return GraphCheck(None, [str(exc)], warnings)
    if plan.layout is not None:
        try:
            plan_cache(plan.layout, spec.state.kv_cache, spec.generation.past_present_share_buffer)
        except ConfigError as exc:
            errors += [str(p) for p in exc.problems]
        except GenaiRuntimeError as exc:  # the graph is fine; this runtime cannot run it yet
            warnings.append(f"runtime: {exc}")
    errors += [str(p) for p in config_problems(spec, plan)]
    if not errors and spec.plugin is None:
        probe_errors, probe_warnings = probe_problems(spec, plan, sessions)
        errors += probe_errors
        warnings += probe_warnings
    if spec.plugin is not None:
        warnings.append("pipeline.plugin loads code: it runs only with trust_remote_code=True")
    return GraphCheck(plan, errors, warnings)
