"""Static checks of a pipeline's shape, done at load before any session exists.

Stage limit, sessions that flow steps / wires / roles name, duplicate stages, session names with
dots, dataflow cycles (reported as the cycle itself) and wires that run against the flow order.
"""

from __future__ import annotations

from ..errors import ConfigError, ConfigProblem
from ..spec import PHASES, PipelineSpec
from .loader import json_path


def stage_sessions(spec: PipelineSpec) -> list[str]:
    """Sessions the pipeline runs: flow order first, then those only a strategy/role uses."""
    names = list(dict.fromkeys(step.run for step in spec.flow))
    extra = [*spec.roles.values(), spec.strategy.draft_session, spec.strategy.verify_session]
    names += [n for n in dict.fromkeys(extra) if n and n not in names]
    return names


def flow_problems(spec: PipelineSpec) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    known = set(spec.sessions)

    def unknown(where: str, name: str | None) -> None:
        if name is not None and name not in known:
            valid = ", ".join(sorted(known)) or "(none)"
            problems.append(ConfigProblem(where, f"{name!r} names no session (sessions: {valid})"))

    for name in spec.sessions:
        if "." in name:
            where = json_path(["pipeline", "sessions", name])
            problems.append(ConfigProblem(where, "session names may not contain dots"))
    stages = stage_sessions(spec)
    if len(stages) > spec.max_stages:
        problems.append(
            ConfigProblem(
                "pipeline.flow",
                f"{len(stages)} stages ({', '.join(stages)}) exceed the stage limit "
                f"{spec.max_stages} (raise pipeline.max_stages to allow more)",
            )
        )
    seen: dict[tuple[str, str], int] = {}
    for i, step in enumerate(spec.flow):
        unknown(f"pipeline.flow[{i}].run", step.run)
        unknown(f"pipeline.flow[{i}].cross_attention_from", step.cross_attention_from)
        key = (step.when, step.run)
        if key in seen:
            problems.append(
                ConfigProblem(
                    f"pipeline.flow[{i}].run",
                    f"duplicate stage {step.run!r} in phase {step.when!r} "
                    f"(already at pipeline.flow[{seen[key]}])",
                )
            )
        seen.setdefault(key, i)
        if not (step.run_on_prompt or step.run_on_token_gen):
            problems.append(
                ConfigProblem(
                    f"pipeline.flow[{i}]", "a stage must run on the prompt, tokens, or both"
                )
            )
    for i, wire in enumerate(spec.dataflow):
        for side, name, tensor in (
            ("from", wire.src, wire.src_tensor),
            ("to", wire.dst, wire.dst_tensor),
        ):
            unknown(f"pipeline.dataflow[{i}].{side}", name)
            if not tensor:
                problems.append(
                    ConfigProblem(f"pipeline.dataflow[{i}].{side}", "expected 'session.tensor'")
                )
    for role, name in spec.roles.items():
        unknown(f"pipeline.roles.{role}", name)
    unknown("pipeline.strategy.draft.session", spec.strategy.draft_session)
    unknown("pipeline.strategy.verify.session", spec.strategy.verify_session)
    if spec.state.cross_cache:
        unknown("pipeline.state.cross_cache.source", spec.state.cross_cache.source)
    if spec.plugin is None and not spec.steps("step"):
        problems.append(ConfigProblem("pipeline.flow", "no stage runs in phase 'step'"))
    problems += _cycle_problems(spec)
    problems += _order_problems(spec)
    return problems


def check_flow(spec: PipelineSpec) -> None:
    problems = flow_problems(spec)
    if problems:
        raise ConfigError(problems)


def _cycle_problems(spec: PipelineSpec) -> list[ConfigProblem]:
    edges: dict[str, list[str]] = {}
    for wire in spec.dataflow:
        edges.setdefault(wire.src, []).append(wire.dst)
    cycle = find_cycle(edges)
    if not cycle:
        return []
    return [ConfigProblem("pipeline.dataflow", "dataflow cycle: " + " -> ".join(cycle))]


def find_cycle(edges: dict[str, list[str]]) -> list[str] | None:
    """First cycle found by depth-first search, as the node path that closes it."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in edges.get(node, []):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in list(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _order_problems(spec: PipelineSpec) -> list[ConfigProblem]:
    """A wire must not feed a stage that runs earlier: an earlier phase, or earlier in the same."""
    position = {}
    for i, step in enumerate(spec.flow):
        position.setdefault(step.run, (PHASES.index(step.when), i))
    problems = []
    for i, wire in enumerate(spec.dataflow):
        src, dst = position.get(wire.src), position.get(wire.dst)
        if src and dst and src > dst:
            problems.append(
                ConfigProblem(
                    f"pipeline.dataflow[{i}]",
                    f"wire {wire} feeds {wire.dst!r}, which runs before {wire.src!r} in the flow",
                )
            )
    return problems
