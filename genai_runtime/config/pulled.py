"""Where pulled models live, and which folder a bare model name means.

The cache is ``$GENAI_RUNTIME_CACHE``, else ``$XDG_CACHE_HOME/genai_runtime/models``, else
``~/.cache/genai_runtime/models``. A path that exists always wins over a name; a name is one
plain folder name (no separator, not hidden), so it can never point outside the cache.
Standard library only: ``Config``/``Model`` resolve names through here without importing the
importer.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "GENAI_RUNTIME_CACHE"
_MAX_NAME_CHARS = 200


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/genai_runtime``, else ``~/.cache/genai_runtime`` (chat history lives
    here, pulled models under ``models/`` unless ``$GENAI_RUNTIME_CACHE`` says otherwise)."""
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "genai_runtime"


def cache_root(override: str | os.PathLike | None = None) -> Path:
    """The folder pulled models are written to and found in."""
    if override:
        return Path(override).expanduser()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return user_cache_dir() / "models"


def is_model_name(text: str) -> bool:
    """Whether ``text`` reads as a pulled model's name rather than a path."""
    return (
        0 < len(text) <= _MAX_NAME_CHARS
        and not text.startswith((".", "~"))
        and "\x00" not in text
        and all(sep not in text for sep in ("/", "\\", os.sep))
    )


def pulled_folder(name_or_path: str | os.PathLike) -> Path | None:
    """The cache folder of a pulled model called ``name_or_path``; None when the argument is an
    existing path, is not a plain name, or no such model has been pulled."""
    text = os.fspath(name_or_path)
    if not isinstance(text, str) or not is_model_name(text) or os.path.exists(text):
        return None
    folder = cache_root() / text
    return folder if (folder / "genai_config.json").is_file() else None
