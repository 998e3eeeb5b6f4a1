"""Optional dependencies (pip extras): what each one brings, and a check that names the extra to
install before a command starts any work (a model load, a download).

The check only looks the modules up (``importlib.util.find_spec``); nothing is imported.
"""

from __future__ import annotations

import importlib.util

from .errors import UnsupportedError

# pyproject.toml's optional-dependencies -> the modules each one provides.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "audio": ("soundfile",),
    "vision": ("PIL",),
    "gguf": ("gguf", "onnx", "tqdm", "safetensors"),
    "constrained": ("llguidance",),
    "server": ("starlette", "uvicorn"),
}


def missing_modules(extra: str) -> tuple[str, ...]:
    """The modules of ``extra`` that cannot be imported here."""
    missing = []
    for name in EXTRA_MODULES[extra]:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken install, or sys.modules[name] is None
            found = False
        if not found:
            missing.append(name)
    return tuple(missing)


def require_extra(extra: str, needed_for: str) -> None:
    """Raise ``UnsupportedError`` naming the extra to install when ``extra`` is not installed."""
    missing = missing_modules(extra)
    if missing:
        raise UnsupportedError(
            f'{needed_for} needs the "{extra}" extra ({", ".join(missing)} not installed): '
            f'pip install "genai_runtime[{extra}]" (in a checkout: pip install -e ".[{extra}]")'
        )
