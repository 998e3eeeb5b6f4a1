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

from .errors import GenaiRuntimeError, first_line


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


_gpu: dict[str, int | None] = {"device_id": None}


def set_current_gpu_device_id(device_id: int) -> None:
    """The GPU that CUDA sessions created from now on use (their ``device_id`` provider option,
    unless the config sets one). Needs an onnxruntime with the CUDA provider; the reference's
    CPU build crashes on this call, this one raises."""
    if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0:
        raise GenaiRuntimeError(
            f"set_current_gpu_device_id: expected a device index >= 0, got {device_id!r}"
        )
    _need_cuda("set_current_gpu_device_id")
    _gpu["device_id"] = device_id


def get_current_gpu_device_id() -> int:
    _need_cuda("get_current_gpu_device_id")
    return _gpu["device_id"] or 0


def gpu_device_id() -> int | None:
    """The id set by ``set_current_gpu_device_id`` (None: never set)."""
    return _gpu["device_id"]


def _need_cuda(call: str) -> None:
    if not is_cuda_available():
        raise GenaiRuntimeError(
            f"{call}: this onnxruntime build has no CUDA execution provider (available: "
            f"{', '.join(ort.get_available_providers())})"
        )


_libraries: dict[str, str] = {}  # registration name -> library path


def register_execution_provider_library(registration_name: str, library_path: str) -> None:
    """Load an execution provider shipped as a plugin library (onnxruntime's
    ``register_execution_provider_library``); a config that names the provider then runs on
    the devices it offers."""
    if not isinstance(registration_name, str) or not registration_name:
        raise GenaiRuntimeError(
            f"register_execution_provider_library: expected a provider name, got "
            f"{registration_name!r}"
        )
    if not isinstance(library_path, str) or not library_path:
        raise GenaiRuntimeError(
            f"register_execution_provider_library: expected a library path, got {library_path!r}"
        )
    if registration_name in _libraries:
        raise GenaiRuntimeError(
            f"execution provider library {registration_name!r} is already registered "
            f"({_libraries[registration_name]})"
        )
    try:
        ort.register_execution_provider_library(registration_name, library_path)
    except Exception as exc:  # onnxruntime's Fail: missing file, not a library, no devices
        reason = first_line(exc)
        raise GenaiRuntimeError(
            f"cannot register execution provider library {registration_name!r} from "
            f"{library_path}: {reason}"
        ) from exc
    _libraries[registration_name] = library_path


def unregister_execution_provider_library(registration_name: str) -> None:
    if registration_name not in _libraries:
        known = ", ".join(repr(n) for n in _libraries) or "none"
        raise GenaiRuntimeError(
            f"execution provider library {registration_name!r} was not registered "
            f"(registered: {known})"
        )
    try:
        ort.unregister_execution_provider_library(registration_name)
    except Exception as exc:  # still used by a live session
        raise GenaiRuntimeError(
            f"cannot unregister execution provider library {registration_name!r}: {exc}"
        ) from exc
    del _libraries[registration_name]


def plugin_devices(provider: str) -> list[Any]:
    """onnxruntime's devices for a provider offered by a registered plugin library (empty for
    the providers built into onnxruntime, which sessions select by name)."""
    if not _libraries or provider in ort.get_available_providers():
        return []
    return [d for d in ort.get_ep_devices() if d.ep_name == provider]
