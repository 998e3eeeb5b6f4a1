"""Static flow checks at load: each problem is a ConfigError naming its JSON path.

Configs are written to real files and loaded, as users do; a few shapes the schema already
refuses are checked on a spec built directly, to show the flow check catches them too.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from genai_runtime.config import load
from genai_runtime.config.build import build_spec
from genai_runtime.config.flow import check_flow, find_cycle, flow_problems, stage_sessions
from genai_runtime.errors import ConfigError, ConfigProblem
from genai_runtime.spec import DEFAULT_MAX_STAGES


def write(folder: Path, pipeline: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"version": 2, "pipeline": pipeline, "generation": {"max_length": 32}}
    (folder / "genai_config.json").write_text(json.dumps(doc), encoding="utf-8")
    return folder


def chain(n: int, **extra: Any) -> dict[str, Any]:
    """``n`` step stages s0 -> s1 -> ... each wired to the next."""
    names = [f"s{i}" for i in range(n)]
    return {
        "sessions": {name: {"file": f"{name}.onnx"} for name in names},
        "flow": [{"run": name, "when": "step"} for name in names],
        "dataflow": [{"from": f"{a}.h", "to": f"{b}.h"} for a, b in itertools.pairwise(names)],
        **extra,
    }


def two(flow: list[dict[str, Any]], dataflow: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "sessions": {"a": {"file": "a.onnx"}, "b": {"file": "b.onnx"}},
        "flow": flow,
        "dataflow": dataflow,
    }


def problems_of(tmp_path: Path, pipeline: dict[str, Any]) -> list[ConfigProblem]:
    with pytest.raises(ConfigError) as info:
        load(write(tmp_path, pipeline))
    assert info.value.source == str(tmp_path / "genai_config.json")  # errors name the file
    return list(info.value.problems)


def only(problems: list[ConfigProblem], path: str) -> ConfigProblem:
    found = [p for p in problems if p.path == path]
    assert len(found) == 1, problems
    return found[0]


# ------------------------------------------------------------------------------ stage limit


def test_default_stage_limit_is_ten(tmp_path: Path) -> None:
    assert DEFAULT_MAX_STAGES == 10
    assert len(load(write(tmp_path, chain(10))).flow) == 10


def test_eleven_chained_stages_exceed_the_default_limit(tmp_path: Path) -> None:
    problem = only(problems_of(tmp_path, chain(11)), "pipeline.flow")
    assert "11 stages (s0, s1" in problem.message
    assert "exceed the stage limit 10" in problem.message
    assert "pipeline.max_stages" in problem.message  # says how to allow more


def test_max_stages_raises_the_limit(tmp_path: Path) -> None:
    spec = load(write(tmp_path / "ok", chain(11, max_stages=12)))
    assert (len(spec.flow), spec.max_stages) == (11, 12)
    problem = only(problems_of(tmp_path / "bad", chain(13, max_stages=12)), "pipeline.flow")
    assert "13 stages" in problem.message and "limit 12" in problem.message


def test_sessions_used_only_by_the_strategy_count_as_stages(tmp_path: Path) -> None:
    pipeline = chain(10)
    pipeline["sessions"]["draft"] = {"file": "draft.onnx"}
    pipeline["strategy"] = {
        "kind": "speculative",
        "draft": {"producer": "draft_model", "session": "draft"},
    }
    problem = only(problems_of(tmp_path, pipeline), "pipeline.flow")
    assert "11 stages" in problem.message and "draft" in problem.message


# ------------------------------------------------------------------------------ cycles and order


def test_dataflow_cycle_is_printed(tmp_path: Path) -> None:
    pipeline = two(
        [{"run": "a"}, {"run": "b"}],
        [{"from": "a.x", "to": "b.x"}, {"from": "b.y", "to": "a.y"}],
    )
    problem = only(problems_of(tmp_path, pipeline), "pipeline.dataflow")
    assert problem.message == "dataflow cycle: a -> b -> a"


def test_longer_cycle_is_printed_from_where_it_closes(tmp_path: Path) -> None:
    pipeline = chain(3)
    pipeline["dataflow"].append({"from": "s2.h", "to": "s0.h"})
    problem = only(problems_of(tmp_path, pipeline), "pipeline.dataflow")
    assert problem.message == "dataflow cycle: s0 -> s1 -> s2 -> s0"


def test_find_cycle() -> None:
    assert find_cycle({"a": ["b"], "b": ["c"]}) is None
    assert find_cycle({"a": ["a"]}) == ["a", "a"]
    assert find_cycle({"x": ["a"], "a": ["b"], "b": ["a"]}) == ["a", "b", "a"]


def test_wire_feeding_a_stage_that_runs_earlier(tmp_path: Path) -> None:
    pipeline = two([{"run": "a"}, {"run": "b"}], [{"from": "b.h", "to": "a.h"}])
    problem = only(problems_of(tmp_path, pipeline), "pipeline.dataflow[0]")
    assert problem.message == "wire b.h -> a.h feeds 'a', which runs before 'b' in the flow"


def test_wire_from_a_step_stage_into_an_init_stage(tmp_path: Path) -> None:
    # b comes first in the list, but init runs before step: the phase decides.
    pipeline = two(
        [{"run": "b", "when": "step"}, {"run": "a", "when": "init"}],
        [{"from": "b.h", "to": "a.h"}],
    )
    problem = only(problems_of(tmp_path, pipeline), "pipeline.dataflow[0]")
    assert "feeds 'a', which runs before 'b'" in problem.message


def test_wires_forward_in_flow_order_are_fine(tmp_path: Path) -> None:
    pipeline = two([{"run": "a", "when": "init"}, {"run": "b"}], [{"from": "a.h", "to": "b.h"}])
    assert [str(w) for w in load(write(tmp_path, pipeline)).dataflow] == ["a.h -> b.h"]


# ------------------------------------------------------------------------------ names


@pytest.mark.parametrize("side", ["from", "to"])
def test_wire_endpoint_naming_no_session(tmp_path: Path, side: str) -> None:
    wire = {"from": "a.h", "to": "b.h", side: "ghost.h"}
    pipeline = two([{"run": "a"}, {"run": "b"}], [wire])
    problem = only(problems_of(tmp_path, pipeline), f"pipeline.dataflow[0].{side}")
    assert problem.message == "'ghost' names no session (sessions: a, b)"


def test_flow_step_naming_no_session(tmp_path: Path) -> None:
    pipeline = two([{"run": "a"}, {"run": "c"}], [])
    problem = only(problems_of(tmp_path, pipeline), "pipeline.flow[1].run")
    assert "'c' names no session" in problem.message


def test_cross_attention_and_roles_naming_no_session(tmp_path: Path) -> None:
    pipeline = two([{"run": "a"}, {"run": "b", "cross_attention_from": "enc"}], [])
    pipeline["roles"] = {"target": "tgt"}
    problems = problems_of(tmp_path, pipeline)
    assert (
        "'enc' names no session" in only(problems, "pipeline.flow[1].cross_attention_from").message
    )
    assert "'tgt' names no session" in only(problems, "pipeline.roles.target").message


def test_duplicate_stage_in_one_phase(tmp_path: Path) -> None:
    pipeline = two([{"run": "a"}, {"run": "b"}, {"run": "a"}], [])
    problem = only(problems_of(tmp_path, pipeline), "pipeline.flow[2].run")
    assert problem.message == "duplicate stage 'a' in phase 'step' (already at pipeline.flow[0])"


def test_same_session_in_two_phases_is_allowed(tmp_path: Path) -> None:
    pipeline = two([{"run": "a", "when": "init"}, {"run": "a"}, {"run": "b"}], [])
    spec = load(write(tmp_path, pipeline))
    assert [(s.run, s.when) for s in spec.flow] == [("a", "init"), ("a", "step"), ("b", "step")]
    assert stage_sessions(spec) == ["a", "b"]  # counted once against the stage limit


def test_session_name_with_a_dot_is_refused_at_load(tmp_path: Path) -> None:
    pipeline = {"sessions": {"enc.v2": {"file": "e.onnx"}}, "flow": [{"run": "dec"}]}
    problems = problems_of(tmp_path, pipeline)
    problem = only(problems, 'pipeline.sessions["enc.v2"]')
    assert "invalid name 'enc.v2'" in problem.message and "no dots" in problem.message


def _dotted_spec():
    # The schema refuses dotted names, so build the spec directly to reach the flow check.
    doc = {
        "version": 2,
        "pipeline": {"sessions": {"enc.v2": {"file": "e.onnx"}}, "flow": [{"run": "enc.v2"}]},
    }
    return build_spec(doc)


def test_session_name_with_a_dot_is_refused_by_the_flow_check() -> None:
    problems = flow_problems(_dotted_spec())
    assert any("session names may not contain dots" in p.message for p in problems)
    with pytest.raises(ConfigError):
        check_flow(_dotted_spec())


def test_dotted_session_name_path_is_quoted_like_the_loaders() -> None:
    [problem] = [p for p in flow_problems(_dotted_spec()) if "dots" in p.message]
    assert problem.path == 'pipeline.sessions["enc.v2"]'


# ------------------------------------------------------------------------------ phases


def test_no_step_stage(tmp_path: Path) -> None:
    pipeline = two([{"run": "a", "when": "init"}, {"run": "b", "when": "final"}], [])
    problem = only(problems_of(tmp_path, pipeline), "pipeline.flow")
    assert problem.message == "no stage runs in phase 'step'"


def test_empty_flow_has_no_step_stage(tmp_path: Path) -> None:
    pipeline = {"sessions": {"a": {"file": "a.onnx"}}, "flow": []}
    assert (
        "no stage runs in phase 'step'"
        in only(problems_of(tmp_path, pipeline), "pipeline.flow").message
    )


def test_stage_that_runs_on_neither_pass(tmp_path: Path) -> None:
    pipeline = two(
        [{"run": "a", "run_on_prompt": False, "run_on_token_gen": False}, {"run": "b"}], []
    )
    problem = only(problems_of(tmp_path, pipeline), "pipeline.flow[0]")
    assert "must run on the prompt, tokens, or both" in problem.message


def test_all_problems_are_reported_together(tmp_path: Path) -> None:
    pipeline = two(
        [{"run": "a"}, {"run": "a"}, {"run": "b"}],
        [{"from": "b.h", "to": "ghost.h"}, {"from": "b.y", "to": "a.y"}],
    )
    paths = {p.path for p in problems_of(tmp_path, pipeline)}
    assert {"pipeline.flow[1].run", "pipeline.dataflow[0].to", "pipeline.dataflow[1]"} <= paths
