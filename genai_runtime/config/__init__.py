"""Config loading: read → validate → v1→v2 → presets → validate again → frozen spec → checks."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, PathEscapeError
from ..spec import PipelineSpec
from .build import build_spec
from .flow import check_flow
from .loader import load_document, validate_document
from .paths import check_paths, path_problem
from .presets import resolve_presets
from .v1 import merge_embedded_v1, translate_v1

__all__ = ["V2_SCHEMA_NAME", "load", "migrate_document", "to_v2"]

V2_SCHEMA_NAME = "genai_config.v2.schema.json"


def to_v2(doc: dict[str, Any], version: int) -> dict[str, Any]:
    """The v2 form of a validated document, presets not yet resolved (what ``migrate`` writes)."""
    return translate_v1(doc) if version == 1 else merge_embedded_v1(doc)


def migrate_document(path: str | os.PathLike) -> dict[str, Any]:
    """The v2 form of a config (presets not resolved), ``$schema`` first; checked against v2."""
    loaded = load_document(path)
    doc = to_v2(loaded.doc, loaded.version)
    out = {"$schema": V2_SCHEMA_NAME, **{k: v for k, v in doc.items() if k != "$schema"}}
    # A translation that the v2 schema rejects is our bug; say so rather than write it.
    validate_document(out, 2, source=f"{loaded.path} (migrated to v2)")
    return out


def load(
    path: str | os.PathLike,
    overlay: dict[str, Any] | str | None = None,
    *,
    preset_dirs: Sequence[str | os.PathLike] = (),
    root: str | os.PathLike | None = None,
) -> PipelineSpec:
    """Load a model folder's config (JSON or YAML, v1 or v2) into a checked PipelineSpec.

    ``root`` widens where config file names may point (default: the model folder itself).
    """
    loaded = load_document(path, overlay, root=Path(root) if root is not None else None)
    source = str(loaded.path)
    root_dir = Path(root) if root is not None else None
    problems = check_paths(loaded.doc, loaded.model_dir, root_dir)
    if problems:
        raise PathEscapeError(problems, source)
    doc = to_v2(loaded.doc, loaded.version)
    doc, chain = resolve_presets(doc, [Path(p) for p in preset_dirs])
    validate_document(doc, 2, source=f"{source} (after translation and presets)")
    spec = build_spec(doc, loaded.model_dir, chain, source_version=loaded.version, root=root_dir)
    problems = [
        p
        for name, s in spec.sessions.items()
        if (p := path_problem(loaded.model_dir, s.file, root_dir, f"pipeline.sessions.{name}.file"))
    ]
    if problems:
        raise PathEscapeError(problems, source)
    try:
        check_flow(spec)
    except ConfigError as exc:
        raise ConfigError(exc.problems, source) from None
    return spec
