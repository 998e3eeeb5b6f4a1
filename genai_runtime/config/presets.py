"""Preset resolution: ``pipeline.extends`` names a preset whose pipeline fills what is omitted.

A preset is a JSON file ``<name>.json`` holding ``{"description", "extends"?, "pipeline"}``.
User folders are searched before the built-in ``presets/``. Merge rules (replace, don't merge
lists): an explicit ``flow`` / ``dataflow`` / ``roles`` / ``strategy`` replaces the preset's;
``sessions`` merge by session name and ``state`` key by key, explicit values winning.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ConfigProblem
from .resources import resource_dir

_MERGED_BY_KEY = ("sessions", "state")


def builtin_presets_dir() -> Path:
    return resource_dir("presets")


def available_presets(extra_dirs: Sequence[Path] = ()) -> dict[str, Path]:
    """Preset name -> file, user folders first (a user preset shadows a built-in one)."""
    found: dict[str, Path] = {}
    for folder in [*extra_dirs, builtin_presets_dir()]:
        for path in sorted(Path(folder).glob("*.json")):
            found.setdefault(path.stem, path)
    return found


def load_preset(name: str, extra_dirs: Sequence[Path] = (), where: str = "pipeline.extends"):
    presets = available_presets(extra_dirs)
    if name not in presets:
        valid = ", ".join(sorted(presets)) or "(none)"
        raise ConfigError(
            [ConfigProblem(where, f"unknown preset {name!r} (expected one of: {valid})")]
        )
    path = presets[name]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        problem = ConfigProblem(where, f"preset {name!r} unreadable: {exc}")
        raise ConfigError([problem], str(path)) from exc
    if not isinstance(data, dict) or not isinstance(data.get("pipeline", {}), dict):
        raise ConfigError(
            [ConfigProblem(where, f"preset {name!r} must be an object with 'pipeline'")]
        )
    return data, path


def resolve_presets(doc: dict[str, Any], extra_dirs: Sequence[Path] = ()) -> tuple[dict, list[str]]:
    """Return (document with its pipeline's preset chain merged in, chain of preset names)."""
    pipeline = doc.get("pipeline")
    if not isinstance(pipeline, dict) or "extends" not in pipeline:
        return doc, []
    chain: list[str] = []
    merged = {k: v for k, v in pipeline.items() if k != "extends"}
    name: str | None = pipeline["extends"]
    where = "pipeline.extends"
    while name is not None:
        if name in chain:
            cycle = " -> ".join([*chain, name])
            raise ConfigError.at(where, f"preset cycle: {cycle}")
        chain.append(name)
        data, path = load_preset(name, extra_dirs, where)
        body = dict(data.get("pipeline", {}))
        # A preset may chain with a top-level "extends" or, like a config, inside "pipeline".
        parent = data.get("extends", body.pop("extends", None))
        merged = merge_pipeline(body, merged)
        name = parent
        where = f"preset {path.name}: extends"
    out = dict(doc)
    out["pipeline"] = merged
    return out, chain


def merge_pipeline(base: dict[str, Any], explicit: dict[str, Any]) -> dict[str, Any]:
    """Lay an explicit pipeline block over a preset's (see module doc for the rules)."""
    out = copy.deepcopy(base)
    for key, value in explicit.items():
        if key in _MERGED_BY_KEY and isinstance(value, dict):
            out[key] = {**out.get(key, {}), **copy.deepcopy(value)}
        else:
            out[key] = copy.deepcopy(value)
    return out
