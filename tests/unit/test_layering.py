"""The floor plan, checked from the source so it cannot quietly come back undone.

Every import in ``genai_runtime`` (module level, inside functions and under ``TYPE_CHECKING``
alike) is read with ``ast``. Floors are listed bottom up (``docs/design/architecture.md``
draws the same plan): a module may import its own floor or lower ones, never higher. Import
loops between files are counted, and so are writes into another object's private fields.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "genai_runtime"

# Bottom up. A module's floor is that of the longest prefix listed for it.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors", "checks", "telemetry"),
    ("spec", "environment", "config.bounded", "extras", "folder_paths"),
    (
        "validation",
        "session",
        "decoding",
        "tokenizer",
        "audio",
        "routing",
        "timing",
        "folder_hashes",
        "generation_defaults",
    ),
    ("config",),
    ("kv",),
    ("runtime",),
    ("speculative", "plugins", "multimodal"),
    ("model", "generator", "adapters", "explain", "chat"),
    ("server", "batching", "importer", "integrations"),
    ("cli", "__init__", "__main__"),
)
# onnxruntime-genai's API has Model and Generator refer to each other; nothing else may loop.
ALLOWED_LOOP = frozenset({"model", "generator"})
MAX_LINES = 750


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _target(module: str, path: Path, node: ast.ImportFrom) -> str | None:
    if node.level == 0:
        if not (node.module or "").startswith("genai_runtime"):
            return None
        base = (node.module or "").removeprefix("genai_runtime").lstrip(".")
    else:
        parts = module.split(".") if module != "__init__" else []
        if path.name != "__init__.py":
            parts = parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join([*parts, *([node.module] if node.module else [])])
    return base


def _imports() -> set[tuple[str, str]]:
    """(importer, imported) module pairs, each imported name resolved to the module that
    defines it where that is a module of ours."""
    edges = set()
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = _target(module, path, node)
                if base is None:
                    continue
                names = [f"{base}.{a.name}".strip(".") for a in node.names]
                names = [n if n in MODULES else base for n in names]
            elif isinstance(node, ast.Import):
                names = [
                    a.name.removeprefix("genai_runtime").lstrip(".") or "__init__"
                    for a in node.names
                    if a.name.startswith("genai_runtime")
                ]
            for name in names:
                while name and name not in MODULES:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    edges.add((module, name or "__init__"))
    return edges


EDGES = _imports()


def floor(module: str) -> int:
    best, level = -1, None
    for i, names in enumerate(FLOORS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, level = len(name), i
    if level is None:
        raise AssertionError(f"module {module!r} has no floor in FLOORS: place it")
    return level


def _cycles(nodes: set[str], edges: set[tuple[str, str]]) -> list[set[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    graph: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        if a in graph and b in graph:
            graph[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _package(module: str) -> str:
    return module.split(".")[0]


def test_every_module_has_a_floor() -> None:
    for module in MODULES:
        floor(module)


def test_no_import_runs_up_a_floor() -> None:
    upward = sorted(
        f"{a} (floor {floor(a)}) -> {b} (floor {floor(b)})" for a, b in EDGES if floor(b) > floor(a)
    )
    assert upward == []


def test_one_import_loop_between_files_at_most_the_reference_api_pair() -> None:
    loops = _cycles(set(MODULES), EDGES)
    assert all(loop <= ALLOWED_LOOP for loop in loops), loops
    assert len(loops) <= 1


def test_no_loop_between_folders() -> None:
    packages = {_package(m) for m in MODULES}
    edges = {(_package(a), _package(b)) for a, b in EDGES if _package(a) != _package(b)}
    loops = _cycles(packages, edges)
    assert all(loop <= ALLOWED_LOOP for loop in loops), loops
    assert not any({"kv", "runtime"} <= loop for loop in loops)


@pytest.mark.parametrize("above", ["runtime", "generator", "model", "speculative", "server"])
def test_decoding_imports_nothing_above_it(above: str) -> None:
    assert not [b for a, b in EDGES if a.startswith("decoding") and _package(b) == above]


def test_no_file_over_the_line_limit() -> None:
    long = {
        m: n
        for m, p in MODULES.items()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


def _private_writes(tree: ast.AST) -> list[tuple[int, str]]:
    """``obj._field = ...`` / ``obj._field[i] = ...`` / ``obj._field += ...`` where ``obj`` is
    not ``self`` or ``cls``."""
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            while isinstance(target, ast.Subscript):
                target = target.value
            if not isinstance(target, ast.Attribute):
                continue
            attr = target.attr
            if not attr.startswith("_") or attr.startswith("__"):
                continue
            owner = target.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            found.append((node.lineno, ast.unparse(target)))
    return found


def test_no_module_writes_another_objects_private_fields() -> None:
    writes = {
        module: hits
        for module, path in MODULES.items()
        if (hits := _private_writes(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert writes == {}


CACHE_CAPABILITIES = frozenset(
    {"chunk", "compact", "reorder", "on_device", "uses_positions", "static_mask", "formats"}
    | {"can_rewind", "can_compact", "can_reorder"}
)


def test_cache_capabilities_are_declared_not_probed() -> None:
    # KVCacheBase declares every capability with its default, so no getattr/hasattr with a
    # capability's name may stand in for reading it.
    probes = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in CACHE_CAPABILITIES
            ):
                probes.append(f"{module}:{node.lineno} {node.func.id}(..., {node.args[1].value!r})")
    assert not probes, probes


def test_no_private_name_is_imported_from_another_package() -> None:
    # A package's underscored names are its own: another package asks for a public one.
    found = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = _target(module, path, node)
            if base is None or _package(base or "__init__") == _package(module):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{module}:{node.lineno} imports {base}.{alias.name}")
    assert not found, found
