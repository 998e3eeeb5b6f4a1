"""Whether a session got the execution providers it asked for, and why not when it did not.

onnxruntime builds a session without a requested provider that cannot start (its shared library
misses a dependency, such as a CUDA library, or no device answers): it logs the failure and goes
on with the providers left, so a model asked to run on a GPU runs on the CPU with no error.
``check_granted`` compares the session's providers with the request and raises instead, naming
the provider's missing library and what to install.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from ..errors import UnsupportedError
from .device import install_hint

CPU = "CPUExecutionProvider"
# onnxruntime's session entry that keeps which nodes each provider took (``assignment``); the
# runtime sets it on sessions that ask for a provider besides the CPU's.
RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"


@dataclass(frozen=True)
class Assignment:
    """The nodes of a session's graph (after onnxruntime's optimisations) one provider runs."""

    provider: str
    nodes: int
    # Parts of the graph it took: a compiling provider (OpenVINO) fuses each part into one
    # node; the CPU provider's are one node each.
    parts: int


def assignment(session: ort.InferenceSession) -> tuple[Assignment, ...] | None:
    """Per provider of ``session`` (its order; providers that took nothing included), the nodes
    it runs; None where onnxruntime kept no record (``RECORD_ASSIGNMENT`` unset, or an older
    build)."""
    getter = getattr(session, "get_provider_graph_assignment_info", None)
    if getter is None:
        return None
    try:
        parts = getter()
    except Exception:  # onnxruntime's Fail: the entry was not set for this session
        return None
    nodes: dict[str, int] = dict.fromkeys(session.get_providers(), 0)
    counts: dict[str, int] = dict.fromkeys(nodes, 0)
    for part in parts:
        nodes[part.ep_name] = nodes.get(part.ep_name, 0) + len(part.get_nodes())
        counts[part.ep_name] = counts.get(part.ep_name, 0) + 1
    return tuple(Assignment(name, nodes[name], counts[name]) for name in nodes)


@dataclass(frozen=True)
class ProviderLibrary:
    """The shared library onnxruntime loads a provider from, and what its dependencies need."""

    name: str  # libNAME.so on Linux, NAME.dll on Windows, beside onnxruntime's capi module
    # (start of the missing library's name, what to install); "" matches any, {cuda} is the
    # build's CUDA (" 13").
    needs: tuple[tuple[str, str], ...] = ()

    def advice(self, missing: str | None) -> str:
        for prefix, what in self.needs:
            if (missing or "").startswith(prefix):
                return what.format(cuda=_cuda_version())
        return ""


_CUDA = "the CUDA{cuda} runtime libraries and cuDNN 9"
_DRIVER = ("libcuda.so", "no NVIDIA driver found (libcuda.so.1 comes with it): is there a GPU?")
PROVIDER_LIBRARIES = {
    "CUDAExecutionProvider": ProviderLibrary(
        "onnxruntime_providers_cuda",
        (_DRIVER, ("", f"install {_CUDA}, e.g. pip install 'onnxruntime-gpu[cuda,cudnn]'")),
    ),
    "TensorrtExecutionProvider": ProviderLibrary(
        "onnxruntime_providers_tensorrt", (_DRIVER, ("", f"install TensorRT 10 and {_CUDA}"))
    ),
    "NvTensorRTRTXExecutionProvider": ProviderLibrary("onnxruntime_providers_nv_tensorrt_rtx"),
    "ROCMExecutionProvider": ProviderLibrary("onnxruntime_providers_rocm"),
    "MIGraphXExecutionProvider": ProviderLibrary("onnxruntime_providers_migraphx"),
    "OpenVINOExecutionProvider": ProviderLibrary("onnxruntime_providers_openvino"),
    "QNNExecutionProvider": ProviderLibrary("onnxruntime_providers_qnn"),
    "VitisAIExecutionProvider": ProviderLibrary("onnxruntime_providers_vitisai"),
}


@functools.cache
def preload_libraries() -> None:
    """onnxruntime-gpu's ``preload_dlls``, once a process: it loads the CUDA and cuDNN libraries
    of the nvidia-* pip packages, which the CUDA provider's library does not find by itself."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return
    # It prints each library it cannot load; check_granted names the one that matters, and
    # stdout carries generated text.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(Exception):
        preload()


def check_granted(
    session: ort.InferenceSession,
    requested: Iterable[tuple[str, Mapping[str, str]]],
    where: str,
) -> None:
    """An ``UnsupportedError`` when ``session`` lacks a requested non-CPU provider (``where``:
    the session's JSON path; ``requested``: providers and their options)."""
    granted = session.get_providers()
    for name, options in requested:
        if name != CPU and name not in granted:
            on = f" device_id {options['device_id']}" if "device_id" in options else ""
            raise UnsupportedError(
                f"{where}: execution provider {name}{on} was requested, but onnxruntime built "
                f"the session without it (on {', '.join(granted)}): {why_not(name)}"
            )


def why_not(provider: str) -> str:
    """Why onnxruntime could not give a session ``provider``, and what to install."""
    install = install_hint(provider)
    library = PROVIDER_LIBRARIES.get(provider)
    if library is None:
        return "; ".join(filter(None, ["onnxruntime's log above says why", install]))
    path = library_path(library.name)
    if not path.is_file():
        return "; ".join(filter(None, [f"this onnxruntime has no {path.name}", install]))
    failure = load_failure(path)
    if failure is None:  # onnxruntime got past the library: the provider failed to start
        return f"{path.name} loads, so the provider failed to start (no usable device?)"
    missing = missing_library(failure)
    what = f"missing shared library {missing}" if missing else failure
    advice = library.advice(missing) or install
    return "; ".join(filter(None, [f"{path.name} cannot be loaded: {what}", advice]))


def library_path(name: str) -> Path:
    """Where this onnxruntime keeps a provider's shared library (present or not)."""
    folder = Path(ort.__file__).parent / "capi"
    if sys.platform == "win32":
        return folder / f"{name}.dll"
    return folder / (f"lib{name}.dylib" if sys.platform == "darwin" else f"lib{name}.so")


def load_failure(path: Path) -> str | None:
    """The loader's error for ``path`` (it names a missing dependency), or None if it loads."""
    try:
        ctypes.CDLL(str(path))
    except OSError as exc:
        return str(exc)
    return None


def missing_library(error: str) -> str | None:
    """The dependency a loader error names (``libcublasLt.so.13: cannot open shared object
    file``), if it names one."""
    match = re.search(r"([^\s/:]+): cannot open shared object file", error)
    return match.group(1) if match else None


def _cuda_version() -> str:
    # onnxruntime-gpu records the CUDA it was built with (13.0 for 1.31); other builds do not.
    version = str(getattr(ort, "cuda_version", "") or "")
    return f" {version.split('.')[0]}" if version else ""
