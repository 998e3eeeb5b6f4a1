"""Token trees for speculative verification (Medusa-style ``medusa_choices``).

A path ``[a, b, c]`` names the node reached by taking the a-th ranked candidate at depth 1, the
b-th at depth 2 and the c-th at depth 3; the proposer ranks candidates per depth along its best
path. All nodes go through the target in one pass, each seeing only its ancestors (a 4D mask),
and ``walk_tree`` keeps the one path the target agrees with.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..checks import is_integer
from ..errors import ConfigError
from .sampling import draw

MAX_TREE_NODES = 64  # one verify pass scores every node


@dataclass(frozen=True)
class TokenTree:
    paths: tuple[tuple[int, ...], ...]  # sorted by depth, then rank
    parent: tuple[int, ...]  # index into paths, -1 for the root

    @property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    def widths(self) -> list[int]:
        """How many ranked candidates each depth needs."""
        out = [0] * self.depth
        for path in self.paths:
            out[len(path) - 1] = max(out[len(path) - 1], path[-1] + 1)
        return out

    def nodes(self, candidates: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """The nodes this round's ``candidates`` (ranked tokens per depth) fill: their indices
        into ``paths`` and their tokens. A node whose rank or parent is missing is left out."""
        keep: list[int] = []
        tokens: list[int] = []
        kept = set()
        for i, path in enumerate(self.paths):
            d = len(path) - 1
            if d >= len(candidates) or path[-1] >= len(candidates[d]):
                continue
            if self.parent[i] >= 0 and self.parent[i] not in kept:
                continue
            kept.add(i)
            keep.append(i)
            tokens.append(int(candidates[d][path[-1]]))
        return np.asarray(keep, np.int64), np.asarray(tokens, np.int32)

    def layout(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For ``nodes`` (from ``nodes()``): depth offsets [n] (1 for depth 1), the ancestry
        mask [n, n] (self included) and each node's parent as a row into ``nodes`` (-1: root)."""
        row = {int(node): r for r, node in enumerate(nodes)}
        n = len(nodes)
        visible = np.eye(n, dtype=bool)
        parents = np.full(n, -1, np.int64)
        offsets = np.empty(n, np.int64)
        for r, node in enumerate(nodes):
            offsets[r] = len(self.paths[node])
            p = self.parent[node]
            if p >= 0:
                parents[r] = row[p]
                visible[r] |= visible[row[p]]  # parents come first: their rows are complete
        return offsets, visible, parents


def parse_tree(choices: object, where: str, max_depth: int) -> TokenTree:
    """``medusa_choices`` -> a TokenTree; paths deeper than ``max_depth`` are dropped."""

    def bad(message: str) -> ConfigError:
        return ConfigError.at(where, message)

    if not isinstance(choices, list) or not choices:
        raise bad("expected a non-empty list of paths such as [[0], [0, 0], [1]]")
    paths = set()
    for i, path in enumerate(choices):
        ok = isinstance(path, list) and path and all(is_integer(c) and 0 <= c < 64 for c in path)
        if not ok:
            raise ConfigError.at(
                f"{where}[{i}]", f"expected a non-empty list of ranks 0..63, got {path!r}"
            )
        if len(path) <= max_depth:
            paths.add(tuple(path))
    ordered = sorted(paths, key=lambda p: (len(p), p))
    if len(ordered) > MAX_TREE_NODES:
        raise bad(f"{len(ordered)} nodes; one verify pass takes at most {MAX_TREE_NODES}")
    index = {p: i for i, p in enumerate(ordered)}
    for p in ordered:
        if len(p) > 1 and p[:-1] not in index:
            raise bad(f"path {list(p)} has no parent {list(p[:-1])} in the tree")
    parent = tuple(index[p[:-1]] if len(p) > 1 else -1 for p in ordered)
    return TokenTree(tuple(ordered), parent)


def walk_tree(
    parents: np.ndarray,
    tokens: np.ndarray,
    score: Callable[[int], np.ndarray],
    rng: np.random.Generator | None,
) -> tuple[list[int], int]:
    """The path of nodes the target keeps, and the token after it.

    ``score(r)`` gives the target's row after node r (-1: after the verified prefix): logits
    when ``rng`` is None (greedy: follow the child equal to the argmax), else probabilities.
    Sampling treats the children as point masses tried in rank order: child x is kept with
    probability p(x), else p(x) is zeroed and p renormalised for the next; if none is kept the
    token is drawn from what is left. The token after the path is then distributed exactly as
    the target's own.
    """
    path: list[int] = []
    node = -1
    while True:
        row = score(node)
        children = np.flatnonzero(parents == node)
        if rng is None:
            best = int(np.argmax(row))
            match = children[tokens[children] == best]
            if not match.size:
                return path, best
            node = int(match[0])
            path.append(node)
            continue
        p = np.array(row, np.float64)
        total = p.sum()
        kept = -1
        for child in children:
            x = int(tokens[child])
            if p[x] > 0.0 and rng.random() * total < p[x]:
                kept = int(child)
                break
            total -= p[x]
            p[x] = 0.0
        if kept < 0:
            if total <= 0.0:  # the children held all the mass up to rounding
                p, total = np.array(row, np.float64), float(np.sum(row))
            ids = np.flatnonzero(p)
            return path, draw(ids, p[ids] / total, rng)
        node = kept
        path.append(node)
