"""A generator's runtime options (the reference's ``Generator.set_runtime_option``), applied to
the RunOptions of every stage of its executor.

``terminate_session`` "1" makes onnxruntime abandon a run in flight and refuse later ones until
"0" clears it; any other key is an onnxruntime run config entry
(``onnxruntime_run_options_config_keys.h``), as in the reference.
"""

from __future__ import annotations

import onnxruntime as ort

from ..errors import GenerationError, UnsupportedError
from .executor import Executor

TERMINATE = "terminate_session"
# The reference turns run-level profiling on with this key; onnxruntime's Python RunOptions
# has no such switch, so it is refused rather than stored as a run config entry that does nothing.
PROFILING = "enable_profiling"


MAX_KEY_CHARS = 1024  # onnxruntime refuses a longer run config key (a RuntimeError)


def runtime_option(key: object, value: object) -> tuple[str, str]:
    """Check a (key, value) pair; returns it. ``terminate_session`` takes "0" or "1"."""
    if not isinstance(key, str) or not isinstance(value, str):
        raise GenerationError(
            f"set_runtime_option(key, value): expected two strings, got "
            f"{type(key).__name__} and {type(value).__name__}"
        )
    if not key:
        raise GenerationError("set_runtime_option: the key is empty")
    if len(key) > MAX_KEY_CHARS:
        raise GenerationError(
            f"set_runtime_option: the key has {len(key)} characters; at most {MAX_KEY_CHARS}"
        )
    if key == TERMINATE and value not in ("0", "1"):
        raise GenerationError(f"set_runtime_option: {TERMINATE} expects '0' or '1', got {value!r}")
    if key == PROFILING:
        raise UnsupportedError(
            f"set_runtime_option({PROFILING!r}): onnxruntime's Python API has no run-level "
            "profiling; set session_options.enable_profiling in the config instead"
        )
    return key, value


def apply_runtime_option(executor: Executor, key: str, value: str) -> None:
    """Apply a checked option to every stage (safe while another thread runs a pass: each
    stage's RunOptions is changed in place)."""
    for stage in executor.stages:
        options = stage.bound.run_options
        if options is None:
            options = stage.bound.run_options = ort.RunOptions()
        if key == TERMINATE:
            options.terminate = value == "1"
        else:
            options.add_run_config_entry(key, value)
