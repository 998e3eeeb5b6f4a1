"""The one stop rule: its order, its policies, and that no decode loop decides on its own."""

from __future__ import annotations

import ast

import numpy as np
import pytest
from test_layering import MODULES

from genai_runtime.decoding.stopping import StopPolicy, StopReason, StopRule

EOS = (2, 7)


def test_the_order_is_eos_stop_string_grammar_budget_context() -> None:
    rule = StopRule(EOS, 16)
    everything = dict(generated=4, length=10, budget=4, context=10, complete=True)
    assert rule.check(2, stop_string=lambda: True, **everything) is StopReason.EOS
    assert rule.check(5, stop_string=lambda: True, **everything) is StopReason.STOP_STRING
    assert rule.check(5, stop_string=lambda: False, **everything) is StopReason.GRAMMAR
    everything["complete"] = False
    assert rule.check(5, **everything) is StopReason.BUDGET
    assert rule.check(5, generated=3, length=10, budget=4, context=10) is StopReason.CONTEXT
    assert rule.check(5, generated=3, length=9, budget=4, context=10) is None


def test_an_eos_is_never_decoded_for_stop_strings() -> None:
    asked = []
    rule = StopRule(EOS)
    assert rule.check(7, generated=1, length=1, stop_string=lambda: asked.append(1)) == "eos"
    assert asked == []
    rule.check(3, generated=1, length=1, stop_string=lambda: asked.append(1) or False)
    assert asked == [1]


@pytest.mark.parametrize("unbounded", [None, 0])
def test_no_budget_or_context_bounds_nothing(unbounded) -> None:
    rule = StopRule(EOS)
    assert rule.check(3, generated=10**9, length=10**9, budget=unbounded, context=unbounded) is None


def test_the_engine_policy_lets_a_finished_grammar_run_to_its_eos() -> None:
    engine = StopRule(EOS, policy=StopPolicy(eos_is_output=False, grammar_ends_row=False))
    assert engine.check(5, generated=1, length=1, complete=True) is None
    assert engine.check(5, generated=1, length=1, complete=True, budget=1) is StopReason.BUDGET
    tokens, complete = np.array([2, 5, 6]), np.array([False, True, False])
    assert engine.rows_ended(tokens, complete).tolist() == [True, False, False]
    assert StopRule(EOS, 8).rows_ended(tokens, complete).tolist() == [True, True, False]
    assert StopRule(EOS, 8).on_content(tokens, np.array([True, True, False])).tolist() == [
        False,
        True,
        False,
    ]


def test_openai_finish_reasons() -> None:
    assert {r: r.openai for r in StopReason} == {
        StopReason.EOS: "stop",
        StopReason.STOP_STRING: "stop",
        StopReason.GRAMMAR: "stop",
        StopReason.LOOP: "length",
        StopReason.BUDGET: "length",
        StopReason.CONTEXT: "length",
    }


def _eos_decisions(tree: ast.AST) -> list[int]:
    """Lines that test a token against EOS ids by hand: ``x in <...>eos`` or ``<...>is_eos[x]``."""

    def name(node: ast.AST) -> str:
        return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")

    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Compare)
            and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops)
            and any(name(c).lstrip("_").endswith("eos") for c in node.comparators)
        ):
            lines.append(node.lineno)
        if isinstance(node, ast.Subscript) and name(node.value).lstrip("_") == "is_eos":
            lines.append(node.lineno)
    return lines


# Beam search finishes hypotheses (a search algorithm's bookkeeping), not rows: the rule then
# ends the Generator's rows on the scorer's is_done.
EXEMPT = {"decoding.stopping", "decoding.beam"}


def test_one_stop_rule_site() -> None:
    found = {
        module: lines
        for module, path in MODULES.items()
        if module not in EXEMPT
        and (lines := _eos_decisions(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert found == {}
