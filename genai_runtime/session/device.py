"""Where a session reads its tensors, and the few data moves the runtime makes there.

A ``Device`` is the memory an execution provider reads (``cpu`` for the CPU EP, ``cuda:N`` for
the CUDA EP on GPU N). Buffers the runtime keeps across passes (KV caches, wired outputs) live
on it; host arrays the runtime rewrites each pass reach it through ``BoundSession``: on the host
they are bound by pointer (the CPU EP reads them at run time), on a device they are copied when
bound, so they are rebound after every change (IOBinding copies a host input to the device at
bind time: rewriting the host array afterwards is silently not seen).

The data moves caches need (gathering rows along an axis: rewind, compaction, reordering) run
on the host as NumPy views of the OrtValues' memory, and on a device as a one-node ONNX graph
(``Gather``) on that device's execution provider, so no cache crosses to the host to be moved.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from ..errors import ModelError, UnsupportedError

# onnxruntime execution provider -> the device type its OrtValues are allocated on. Other
# providers read host memory through their own copies: the runtime keeps buffers on the host
# for them but rebinds every changed input (``Device.copies_inputs``), which is always correct.
EP_DEVICES = {
    "CPUExecutionProvider": "cpu",
    "CUDAExecutionProvider": "cuda",
    "DmlExecutionProvider": "dml",
}
# What to install for a provider this onnxruntime build lacks.
EP_PACKAGES = {
    "CUDAExecutionProvider": "onnxruntime-gpu",
    "TensorrtExecutionProvider": "onnxruntime-gpu",
    "NvTensorRTRTXExecutionProvider": "onnxruntime-gpu",
    "ROCMExecutionProvider": "onnxruntime-rocm",
    "DmlExecutionProvider": "onnxruntime-directml",
    "OpenVINOExecutionProvider": "onnxruntime-openvino",
    "QNNExecutionProvider": "onnxruntime-qnn",
    "WebGpuExecutionProvider": "onnxruntime-webgpu",
}


# A session config entry that gives a CPU session a device's semantics: inputs copied when
# bound, caches moved by graph ops. Tests run the device code path on any machine with it.
COPY_ON_BIND = "genai_runtime.copy_on_bind"


@dataclass(frozen=True)
class Device:
    kind: str = "cpu"  # onnxruntime's device type name
    id: int = 0
    # The provider copies a bound host input when it is bound (every EP but the CPU one).
    copies_inputs: bool = False

    @property
    def host(self) -> bool:
        """The runtime may read and write these tensors through NumPy views (the CPU provider)."""
        return self.kind == "cpu" and not self.copies_inputs

    def __str__(self) -> str:
        if self.host:
            return "cpu"
        return f"{self.kind}:{self.id}" if self.kind != "cpu" else "cpu (copy on bind)"

    @classmethod
    def of(cls, session: ort.InferenceSession) -> Device:
        """The device a session's first (preferred) execution provider reads its inputs from."""
        providers = session.get_providers()
        first = providers[0] if providers else "CPUExecutionProvider"
        if first == "CPUExecutionProvider":
            entry = session.get_session_options().get_session_config_entry
            try:
                emulated = entry(COPY_ON_BIND) == "1"
            except RuntimeError:  # onnxruntime raises for an entry never set
                emulated = False
            return cls(copies_inputs=emulated)
        kind = EP_DEVICES.get(first, "cpu")
        options = session.get_provider_options().get(first, {})
        device_id = int(options.get("device_id", 0) or 0) if kind != "cpu" else 0
        return cls(kind, device_id, copies_inputs=True)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> ort.OrtValue:
        """An uninitialised tensor on this device."""
        return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, self.kind, self.id)

    def upload(self, array: np.ndarray) -> ort.OrtValue:
        """``array`` as a tensor on this device (on the host: the array's own memory)."""
        array = np.ascontiguousarray(array)
        if self.host:
            return ort.OrtValue.ortvalue_from_numpy(array)
        return ort.OrtValue.ortvalue_from_numpy(array, self.kind, self.id)

    def take(self, value: ort.OrtValue, indices: np.ndarray, axis: int) -> ort.OrtValue:
        """The entries of ``value`` at ``indices`` along ``axis``, as a new tensor here."""
        indices = np.ascontiguousarray(indices, np.int64)
        if self.host:
            return ort.OrtValue.ortvalue_from_numpy(np.take(value.numpy(), indices, axis=axis))
        return graph_take(self, value, indices, axis)


def graph_take(device: Device, value: ort.OrtValue, indices: np.ndarray, axis: int) -> ort.OrtValue:
    """``Device.take`` as a device does it: a one-node graph on its provider (on the CPU
    provider for a host ``device``, which is how it is tested without a GPU)."""
    session = _gather_session(device, value.data_type(), len(value.shape()), axis)
    binding = session.io_binding()
    binding.bind_ortvalue_input("data", value)
    binding.bind_ortvalue_input("indices", device.upload(np.asarray(indices, np.int64)))
    binding.bind_output("out", device.kind, device.id)
    session.run_with_iobinding(binding)
    return binding.get_outputs()[0]


HOST = Device()


def parse_device(text: str) -> tuple[str, dict[str, str]]:
    """``--device`` text (``cpu``, ``cuda``, ``cuda:1``, ``dml``, ...) -> the genai_config
    provider name and its options (``device_id``)."""
    kind, _, index = text.strip().lower().partition(":")
    if not kind or (index and not index.isdigit()):
        raise UnsupportedError(f"--device {text!r}: expected NAME or NAME:INDEX, e.g. cuda:0")
    return kind, ({"device_id": index} if index else {})


def check_provider(name: str, asked: str | None = None) -> None:
    """A clear error, naming the package to install, when this onnxruntime lacks ``name``
    (``asked``: the name the config used, e.g. ``cuda``)."""
    available = ort.get_available_providers()
    if name in available:
        return
    package = EP_PACKAGES.get(name)
    hint = f"; install {package} in place of onnxruntime" if package else ""
    shown = f"{asked!r} ({name})" if asked and asked != name else name
    raise UnsupportedError(
        f"execution provider {shown} is not available in this onnxruntime build "
        f"(available: {', '.join(available)}){hint}"
    )


@functools.lru_cache(maxsize=32)
def _gather_session(device: Device, data_type: str, rank: int, axis: int) -> ort.InferenceSession:
    """A one-node graph, ``Gather(data, indices, axis)``, on ``device``'s execution provider."""
    try:
        import onnx  # only device execution needs it
        from onnx import helper
    except ImportError:  # pragma: no cover - the gpu extra installs it
        raise UnsupportedError(
            "moving cache rows on a device needs the onnx package (pip install onnx)"
        ) from None
    elem = {
        "tensor(float)": onnx.TensorProto.FLOAT,
        "tensor(float16)": onnx.TensorProto.FLOAT16,
        "tensor(bfloat16)": onnx.TensorProto.BFLOAT16,
        "tensor(int64)": onnx.TensorProto.INT64,
        "tensor(int32)": onnx.TensorProto.INT32,
    }.get(data_type)
    if elem is None:
        raise ModelError(f"cannot move a {data_type} tensor on {device}")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["data", "indices"], ["out"], axis=axis)],
        "gather",
        [
            helper.make_tensor_value_info("data", elem, [None] * rank),
            helper.make_tensor_value_info("indices", onnx.TensorProto.INT64, [None]),
        ],
        [helper.make_tensor_value_info("out", elem, [None] * rank)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    provider = next(ep for ep, kind in EP_DEVICES.items() if kind == device.kind)
    options = [{}] if device.host else [{"device_id": str(device.id)}]
    return ort.InferenceSession(
        model.SerializeToString(), providers=[provider], provider_options=options
    )
