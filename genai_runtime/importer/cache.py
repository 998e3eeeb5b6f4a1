"""How the command line finds a pulled model, with a hint to pull a known one that is missing.

Where pulled models live (``cache_root``) and the name rule are ``config.pulled``'s, which
``Config`` and ``Model`` use too; this adds only what needs the pull catalogue.
"""

from __future__ import annotations

import os

from ..config.pulled import CACHE_ENV, cache_root, is_model_name, pulled_folder
from ..errors import ModelError
from .catalogue import SOURCES

__all__ = ["CACHE_ENV", "cache_root", "resolve_model_dir"]


def resolve_model_dir(name_or_path: str) -> str:
    """An existing path as given; else a pulled model's folder; else the input unchanged."""
    folder = pulled_folder(name_or_path)
    if folder is not None:
        return str(folder)
    if not is_model_name(name_or_path) or os.path.exists(name_or_path):
        return name_or_path
    if name_or_path in SOURCES:
        raise ModelError(
            f"model {name_or_path!r} is not pulled yet (looked in {cache_root() / name_or_path}); "
            f"run: genai-runtime pull {name_or_path}"
        )
    return name_or_path
