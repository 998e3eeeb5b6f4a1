"""Where the schemas and presets shipped with the package live."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]


def resource_dir(name: str) -> Path:
    """``schemas`` or ``presets``: inside an installed wheel, else at the source checkout's root."""
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"genai_runtime resource folder {name!r} not found near {_PACKAGE}")
