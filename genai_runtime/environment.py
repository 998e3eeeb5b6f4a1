"""onnxruntime-genai's module-level functions: execution-provider probes, logging, telemetry.

Provider probes answer for the onnxruntime this process loaded. Logging follows the reference's
switches (``set_log_options(enabled=True, generate_next_token=True, ...)``); entries go to a
callback, a file, or stderr. genai_runtime sends no telemetry, so the telemetry switches only
record the choice.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import onnxruntime as ort

from .errors import GenaiRuntimeError


def _has(provider: str) -> bool:
    return provider in ort.get_available_providers()


def is_cuda_available() -> bool:
    return _has("CUDAExecutionProvider")


def is_dml_available() -> bool:
    return _has("DmlExecutionProvider")


def is_rocm_available() -> bool:
    return _has("ROCMExecutionProvider")


def is_webgpu_available() -> bool:
    return _has("WebGpuExecutionProvider")


def is_qnn_available() -> bool:
    return _has("QNNExecutionProvider")


def is_openvino_available() -> bool:
    return _has("OpenVINOExecutionProvider")


@dataclass
class LogOptions:
    """The reference's log switches (same names); ``enabled`` gates all of them."""

    enabled: bool = False
    ansi_tags: bool = True
    warning: bool = True
    generate_next_token: bool = False
    append_next_tokens: bool = False
    hit_eos: bool = False
    hit_max_length: bool = False
    model_input_values: bool = False
    model_output_shapes: bool = False
    model_output_values: bool = False
    model_logits: bool = False
    ort_lib: bool = False
    value_stats: bool = True


LOG = LogOptions()
_BOOL_OPTIONS = tuple(f.name for f in fields(LogOptions))
_sink: dict[str, Any] = {"callback": None, "filename": ""}


def set_log_options(**options: Any) -> None:
    """Set log switches by name, and ``filename`` (a file that takes precedence over the
    callback; ``""`` goes back to the callback or stderr)."""
    for key, value in options.items():
        if key == "filename":
            if not isinstance(value, str):
                raise GenaiRuntimeError(
                    f"set_log_options: filename must be a string, got {value!r}"
                )
            _sink["filename"] = value
        elif key in _BOOL_OPTIONS:
            if not isinstance(value, bool):
                raise GenaiRuntimeError(f"set_log_options: {key} must be a bool, got {value!r}")
            setattr(LOG, key, value)
        else:
            raise GenaiRuntimeError(
                f"set_log_options: unknown option {key!r} (expected one of: filename, "
                f"{', '.join(_BOOL_OPTIONS)})"
            )


def set_log_callback(callback: Callable[[str], Any] | None) -> None:
    if callback is not None and not callable(callback):
        raise GenaiRuntimeError(f"set_log_callback: expected a callable or None, got {callback!r}")
    _sink["callback"] = callback


def log(label: str, message: str) -> None:
    """Write one entry; callers check ``LOG.enabled`` and their switch first (it is hot-path)."""
    line = f"{label}: {message}\n"
    if _sink["filename"]:
        with open(_sink["filename"], "a", encoding="utf-8") as out:
            out.write(line)
    elif _sink["callback"] is not None:
        _sink["callback"](line)
    else:
        sys.stderr.write(line)


_telemetry = {"enabled": False}


def enable_telemetry_events() -> None:
    """Accepted for compatibility: genai_runtime never sends telemetry."""
    _telemetry["enabled"] = True


def disable_telemetry_events() -> None:
    _telemetry["enabled"] = False
