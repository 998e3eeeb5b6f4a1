"""Where pulled models live, and how ``run NAME`` finds a pulled model.

The cache is ``$GENAI_RUNTIME_CACHE``, else ``$XDG_CACHE_HOME/genai_runtime/models``, else
``~/.cache/genai_runtime/models``.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelError
from .catalogue import SOURCES

CACHE_ENV = "GENAI_RUNTIME_CACHE"


def cache_root(override: str | os.PathLike | None = None) -> Path:
    if override:
        return Path(override).expanduser()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "genai_runtime" / "models"


def resolve_model_dir(name_or_path: str) -> str:
    """An existing path as given; else a pulled model's folder; else the input unchanged."""
    if os.path.exists(name_or_path) or os.sep in name_or_path or name_or_path.startswith("."):
        return name_or_path
    folder = cache_root() / name_or_path
    if (folder / "genai_config.json").is_file():
        return str(folder)
    if name_or_path in SOURCES:
        raise ModelError(
            f"model {name_or_path!r} is not pulled yet (looked in {folder}); "
            f"run: genai-runtime pull {name_or_path}"
        )
    return name_or_path
