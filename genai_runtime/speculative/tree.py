"""Whether the target verifies a strategy's token tree in one pass, or its best linear branch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..decoding.token_tree import TokenTree, parse_tree
from ..errors import ConfigError
from ..kv import CACHE_KINDS
from ..runtime.executor import tree_obstacle
from ..runtime.pipeline import LoadedPipeline

_WHERE = "pipeline.strategy"


def best_linear_branch(choices: Any) -> list[int]:
    """The path of top-1 choices ([0], [0, 0], ...) as deep as ``medusa_choices`` lists it."""
    paths = {tuple(c) for c in choices or () if isinstance(c, list | tuple)}
    branch: list[int] = []
    while (*branch, 0) in paths:
        branch.append(0)
    return branch


def tree_plan(
    target: LoadedPipeline, tree: Mapping[str, Any], k: int
) -> tuple[TokenTree | None, int, str]:
    """The tree the target verifies (None: its best linear branch instead), K, and what
    ``explain`` says about it."""
    where = f"{_WHERE}.tree.medusa_choices"
    choices = tree.get("medusa_choices")
    parsed = parse_tree(choices, where, k)
    plan = target.plan
    kind = target.kv_plan().kind
    can_compact = CACHE_KINDS[kind].can_compact and not plan.layout.drivers
    why = tree_obstacle(plan, can_compact)
    if why is None:
        note = (
            f"token tree ({len(parsed.paths)} nodes, depth {parsed.depth}, widths "
            f"{parsed.widths()}) verified in one pass with a tree attention mask"
        )
        return parsed, parsed.depth, note
    branch = best_linear_branch(choices)
    depth = max(1, min(k, len(branch)))
    note = (
        f"token tree ({len(choices)} medusa_choices) verified as its best linear branch "
        f"{branch or [0]} (K={depth}): {why}"
    )
    return None, depth, note


def tree_note(target: LoadedPipeline) -> str | None:
    """What ``explain`` says about a strategy's token tree, from the target's graphs alone."""
    spec = target.spec
    tree = spec.strategy.params.get("tree") if spec.strategy.kind == "speculative" else None
    if not tree:
        return None
    try:
        return tree_plan(target, tree, spec.strategy.num_speculative_tokens)[2]
    except ConfigError as exc:
        return str(exc)
