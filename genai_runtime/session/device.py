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
Fixed-shape caches write each pass's new rows there the same way (``write_rows_session``,
``slide_rows_session``), and their passes keep each row's last logits there
(``pick_rows_session``).
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from ..errors import ModelError, UnsupportedError
from . import census

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
        if first not in EP_DEVICES and reads_host(session):
            return cls()  # OpenVINO on its CPU device, say: host memory, read at run time
        kind = EP_DEVICES.get(first, "cpu")
        options = session.get_provider_options().get(first, {})
        device_id = int(options.get("device_id", 0) or 0) if kind != "cpu" else 0
        return cls(kind, device_id, copies_inputs=True)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> ort.OrtValue:
        """An uninitialised tensor on this device."""
        if not self.host:
            census.allocated()
        return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, self.kind, self.id)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype, count: int) -> list[ort.OrtValue]:
        """``count`` zero-filled tensors on this device, written there by one run of
        ``ConstantOfShape`` nodes, so nothing of their size crosses from the host. Attention
        kernels read whole tiles past a row's length and mask them: stale memory there may
        hold NaN, which a mask does not cancel."""
        if self.host:
            return [ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, dtype)) for _ in range(count)]
        session = _zeros_session(self, np.dtype(dtype).str, count)
        binding = session.io_binding()
        binding.bind_cpu_input("shape", np.asarray(shape, np.int64))
        for i in range(count):
            binding.bind_output(f"out{i}", self.kind, self.id)
        census.allocated(count)
        census.run(session.run_with_iobinding, binding)
        return binding.get_outputs()

    def upload(self, array: np.ndarray) -> ort.OrtValue:
        """``array`` as a tensor on this device (on the host: the array's own memory). On a
        device it is a private copy: rewriting ``array`` later is not seen (``update`` is how
        a tensor that stays bound takes new contents)."""
        array = np.ascontiguousarray(array)
        if self.host:
            return ort.OrtValue.ortvalue_from_numpy(array)
        census.allocated()
        census.uploaded(array.nbytes)
        if self.kind == "cpu":  # copy on bind, emulated: host memory of its own
            return ort.OrtValue.ortvalue_from_numpy(array.copy())
        return ort.OrtValue.ortvalue_from_numpy(array, self.kind, self.id)

    def update(self, value: ort.OrtValue, array: np.ndarray) -> None:
        """Copy ``array`` into the device tensor ``value`` (same shape and dtype), in place: its
        address stays, so a binding (or a captured graph) that holds it sees the new values."""
        census.uploaded(array.nbytes)
        value.update_inplace(np.ascontiguousarray(array))

    def download(self, value: ort.OrtValue) -> np.ndarray:
        """A device tensor's contents on the host."""
        array = value.numpy()
        if not self.host:
            census.downloaded(array.nbytes)
        return array

    def take(self, value: ort.OrtValue, indices: np.ndarray, axis: int) -> ort.OrtValue:
        """The entries of ``value`` at ``indices`` along ``axis``, as a new tensor here."""
        indices = np.ascontiguousarray(indices, np.int64)
        if self.host:
            return ort.OrtValue.ortvalue_from_numpy(np.take(value.numpy(), indices, axis=axis))
        return graph_take(self, value, indices, axis)

    def take_many(
        self, values: list[ort.OrtValue], indices: np.ndarray, axis: int
    ) -> list[ort.OrtValue]:
        """``take`` of every tensor in ``values`` (same dtype and rank) along one axis: on a
        device one run of one graph gathers them all (a cache's layers), not one run each."""
        if self.host or len(values) == 1:
            return [self.take(v, indices, axis) for v in values]
        return graph_take_many(self, values, np.ascontiguousarray(indices, np.int64), axis)


def graph_take(device: Device, value: ort.OrtValue, indices: np.ndarray, axis: int) -> ort.OrtValue:
    """``Device.take`` as a device does it: a one-node graph on its provider (on the CPU
    provider for a host ``device``, which is how it is tested without a GPU)."""
    return graph_take_many(device, [value], indices, axis)[0]


def graph_take_many(
    device: Device, values: list[ort.OrtValue], indices: np.ndarray, axis: int
) -> list[ort.OrtValue]:
    """``Device.take_many`` on the device: one graph of ``len(values)`` Gather nodes."""
    session = _gather_session(device, values[0].data_type(), len(values[0].shape()), axis,
                              len(values))  # fmt: skip
    binding = session.io_binding()
    for i, value in enumerate(values):
        binding.bind_ortvalue_input(f"data{i}", value)
        binding.bind_output(f"out{i}", device.kind, device.id)
    binding.bind_ortvalue_input("indices", device.upload(np.asarray(indices, np.int64)))
    census.allocated(len(values))
    census.run(session.run_with_iobinding, binding)
    return binding.get_outputs()


HOST = Device()


class StagedArray:
    """A small host array's copy on a device, made once at one address (bind it once):
    ``sync`` copies the array's new contents there, and nothing when they have not changed
    since the last copy (per-row step facts that repeat from one decode step to the next)."""

    def __init__(self, device: Device, array: np.ndarray):
        self.value = device.upload(array)
        self._device = device
        self._sent = np.array(array)

    def sync(self, array: np.ndarray) -> None:
        if not np.array_equal(array, self._sent):
            self._device.update(self.value, array)
            self._sent[...] = array


def reads_host(session: ort.InferenceSession) -> bool:
    """Whether every input and output of ``session`` lives in host memory, as onnxruntime
    places them for its providers (a provider with no memory of its own, such as OpenVINO on
    its CPU device): a bound host array is then read when the session runs, as the CPU
    provider reads it. False where this onnxruntime cannot say (an older build)."""
    try:
        infos = [*session.get_input_memory_infos(), *session.get_output_memory_infos()]
    except AttributeError:
        return False
    return all(info.name == "Cpu" for info in infos)


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
    hint = install_hint(name)
    hint = f"; {hint}" if hint else ""
    shown = f"{asked!r} ({name})" if asked and asked != name else name
    raise UnsupportedError(
        f"execution provider {shown} is not available in this onnxruntime build "
        f"(available: {', '.join(available)}){hint}"
    )


def install_hint(
    provider: str,
    installed: Callable[[str], bool] | None = None,
    available: Collection[str] | None = None,
) -> str:
    """What to install for ``provider`` ("" when no package is known). ``installed``: whether a
    distribution is installed (default: importlib.metadata's answer); ``available``: this
    onnxruntime's providers (default: its own list)."""
    package = EP_PACKAGES.get(provider)
    if package is None:
        return ""
    installed = installed or _installed
    if available is None:
        available = ort.get_available_providers()
    if provider not in available and installed(package) and installed("onnxruntime"):
        # Both wheels hold the one onnxruntime module; the one installed last wrote its files.
        return (
            f"{package} is installed, but so is onnxruntime, whose files replaced its own "
            f"(both hold the onnxruntime module): pip uninstall -y onnxruntime, then "
            f"pip install --force-reinstall --no-deps {package}"
        )
    return f"install {package} in place of onnxruntime"


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@functools.lru_cache(maxsize=32)
def _gather_session(
    device: Device, data_type: str, rank: int, axis: int, count: int = 1
) -> ort.InferenceSession:
    """``count`` Gather nodes sharing one ``indices`` on ``device``'s execution provider."""
    onnx, helper = _onnx("moving cache rows on a device")
    elem = _elem(data_type, device)
    nodes = [
        helper.make_node("Gather", [f"data{i}", "indices"], [f"out{i}"], axis=axis)
        for i in range(count)
    ]
    inputs = [helper.make_tensor_value_info(f"data{i}", elem, [None] * rank) for i in range(count)]
    inputs.append(helper.make_tensor_value_info("indices", onnx.TensorProto.INT64, [None]))
    outputs = [helper.make_tensor_value_info(f"out{i}", elem, [None] * rank) for i in range(count)]
    return _session(device, helper.make_graph(nodes, "gather", inputs, outputs))


@functools.lru_cache(maxsize=32)
def argmax_session(device: Device, data_type: str, rank: int) -> ort.InferenceSession:
    """``ArgMax`` over the last axis (first index on ties, as ``np.argmax``), int64 out, on
    ``device``'s provider: greedy choice where the logits are, so only the ids come back."""
    onnx, helper = _onnx("choosing tokens on a device")
    elem = _elem(data_type, device)
    node = helper.make_node("ArgMax", ["logits"], ["ids"], axis=-1, keepdims=0)
    graph = helper.make_graph(
        [node],
        "argmax",
        [helper.make_tensor_value_info("logits", elem, [None] * rank)],
        [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [None] * (rank - 1))],
    )
    return _session(device, graph)


@functools.lru_cache(maxsize=8)
def top_k_session(device: Device, data_type: str, rank: int) -> ort.InferenceSession:
    """``TopK`` over the last axis (``k`` an int64 [1] input; equal values: lower index first,
    as the host sampler breaks ties), values cast to float32, on ``device``'s provider: top-k
    sampling where the logits are, so only ``k`` candidates per row come back."""
    onnx, helper = _onnx("choosing tokens on a device")
    elem = _elem(data_type, device)
    nodes = [
        helper.make_node("TopK", ["logits", "k"], ["top", "ids"], axis=-1, largest=1, sorted=1),
        helper.make_node("Cast", ["top"], ["values"], to=onnx.TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "top_k",
        [
            helper.make_tensor_value_info("logits", elem, [None] * rank),
            helper.make_tensor_value_info("k", onnx.TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info("values", onnx.TensorProto.FLOAT, [None] * rank),
            helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [None] * rank),
        ],
    )
    return _session(device, graph)


@functools.lru_cache(maxsize=8)
def _zeros_session(device: Device, dtype: str, count: int) -> ort.InferenceSession:
    """``count`` ``ConstantOfShape(shape)`` nodes with a zero of ``dtype`` on ``device``."""
    onnx, helper = _onnx("zeroing buffers on a device")
    zero = onnx.numpy_helper.from_array(np.zeros(1, np.dtype(dtype)))
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], [f"out{i}"], value=zero)
        for i in range(count)
    ]
    graph = helper.make_graph(
        nodes,
        "zeros",
        [helper.make_tensor_value_info("shape", onnx.TensorProto.INT64, [None])],
        [helper.make_tensor_value_info(f"out{i}", zero.data_type, None) for i in range(count)],
    )
    return _session(device, graph)


@functools.lru_cache(maxsize=16)
def write_rows_session(
    device: Device, data_type: str, count: int, chunk: int
) -> ort.InferenceSession:
    """``count`` buffers ``past{i}`` ``[B, H, S, D]``, each bound again as ``out{i}`` (written
    in place by ScatterElements, so only the new rows move), take the new rows ``new{i}``
    ``[B, H, chunk, D]``: ``rows`` (int64 ``[B, 2]``) holds per batch row the slot of its first
    new row and how many of its columns are real; the rest (padding) change nothing. A pad
    column rewrites slot 0's own value, or when the row starts at slot 0 the first slot after
    its real rows, so no write lands on a slot a real row takes (``S >= chunk`` and every
    row's ``start + count <= S``)."""
    g = _Builder("writing cache rows on a device", data_type, device)
    ints = g.onnx.TensorProto.INT64
    g.input("rows", ints, [None, 2])
    start = g.op("Slice", "rows", g.const([0]), g.const([1]), g.const([1]))  # [B, 1]
    real_count = g.op("Slice", "rows", g.const([1]), g.const([2]), g.const([1]))
    cols = g.const(np.arange(chunk, dtype=np.int64)[None, :])  # [1, chunk]
    real = g.op("Less", cols, real_count)  # [B, chunk]
    zero = g.const(0)
    pad = g.op("Where", g.op("Greater", start, zero), zero, real_count)  # [B, 1]
    slot = g.op("Where", real, g.op("Add", start, cols), pad)
    axes = g.const([1, 3])
    index = g.op("Expand", g.op("Unsqueeze", slot, axes), g.op("Shape", "new0"))  # [B, H, C, D]
    real = g.op("Unsqueeze", real, axes)  # [B, 1, chunk, 1]
    for i in range(count):
        g.input(f"past{i}", g.elem, [None] * 4)
        g.input(f"new{i}", g.elem, [None] * 4)
        old = g.op("GatherElements", f"past{i}", index, axis=2)
        rows = g.op("Where", real, f"new{i}", old)
        g.op("ScatterElements", f"past{i}", index, rows, axis=2, out=f"out{i}")
    return g.session("write_rows")


@functools.lru_cache(maxsize=16)
def slide_rows_session(
    device: Device, data_type: str, count: int, ctx: int, chunk: int
) -> ort.InferenceSession:
    """``count`` FIFO buffers ``past{i}`` ``[B, H, ctx, D]``, bound again as ``out{i}``: each
    batch row slides left by its ``shift`` (int64 ``[B]``), dropping its oldest rows, and its
    last ``shift`` slots take the last ``shift`` columns of ``new{i}`` ``[B, H, chunk, D]``
    (a left-padded chunk's real rows). A negative shift slides right (the rows kept by a
    rewind end at the last slot again); slots it empties repeat slot 0. Past and new rows are
    concatenated first, so the gather never reads a slot it has written."""
    g = _Builder("sliding cache rows on a device", data_type, device)
    g.input("shift", g.onnx.TensorProto.INT64, [None])
    slots = g.const(np.arange(ctx, dtype=np.int64)[None, :])  # [1, ctx]
    zero = g.const(0)
    source = g.op("Add", slots, g.op("Unsqueeze", "shift", g.const([1])))  # [B, ctx]
    held = g.op("Where", g.op("Less", source, zero), zero, source)
    # Slots past the held rows read the new ones: past ++ new, from column ctx.
    source = g.op("Where", g.op("Less", source, g.const(ctx)), held,
                  g.op("Add", slots, g.const(chunk)))  # fmt: skip
    index = g.op("Expand", g.op("Unsqueeze", source, g.const([1, 3])), g.op("Shape", "past0"))
    for i in range(count):
        g.input(f"past{i}", g.elem, [None] * 4)
        g.input(f"new{i}", g.elem, [None] * 4)
        both = g.op("Concat", f"past{i}", f"new{i}", axis=2)
        g.op("GatherElements", both, index, axis=2, out=f"out{i}")
    return g.session("slide_rows")


@functools.lru_cache(maxsize=8)
def pick_rows_session(device: Device, data_type: str) -> ort.InferenceSession:
    """``last`` ``[B, V]``, bound again as ``out`` (written in place by ScatterND): batch row b
    takes row ``pick[b]`` of ``logits`` ``[B, C, V]`` flattened to ``[B * C, V]``, or keeps its
    own where ``pick[b]`` is -1 (int64 ``[B]``): a fixed-chunk pass's logits at each row's last
    real token, gathered chunk by chunk where they are."""
    g = _Builder("choosing logits rows on a device", data_type, device)
    ints = g.onnx.TensorProto.INT64
    g.input("logits", g.elem, [None] * 3)
    g.input("last", g.elem, [None, None])
    g.input("pick", ints, [None])
    zero = g.const(0, shape=())
    keep = g.op("Less", "pick", zero)
    flat = g.op("Flatten", "logits", axis=2)
    picked = g.op("Gather", flat, g.op("Where", keep, zero, "pick"), axis=0)
    rows = g.op("Where", g.op("Unsqueeze", keep, g.const([1])), "last", picked)
    batch = g.op("Gather", g.op("Shape", "last"), zero)
    where = g.op("Unsqueeze", g.op("Range", zero, batch, g.const(1, shape=())), g.const([1]))
    g.op("ScatterND", "last", where, rows, out="out")
    return g.session("pick_rows")


class _Builder:
    """A small graph on a device's provider: nodes with generated names, int64 constants."""

    def __init__(self, purpose: str, data_type: str, device: Device):
        self.onnx, self.helper = _onnx(purpose)
        self.elem = _elem(data_type, device)
        self.device = device
        self.nodes: list = []
        self.inits: list = []
        self.inputs: list = []
        self.outputs: list = []

    def input(self, name: str, elem: int, shape: list) -> None:
        self.inputs.append(self.helper.make_tensor_value_info(name, elem, shape))

    def const(self, value, shape: tuple[int, ...] | None = None) -> str:
        array = np.asarray(value, np.int64)
        name = f"c{len(self.inits)}"
        if shape is not None:
            array = array.reshape(shape)
        elif array.ndim == 0:
            array = array.reshape(1)
        self.inits.append(self.onnx.numpy_helper.from_array(array, name))
        return name

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:
        name = out or f"t{len(self.nodes)}"
        self.nodes.append(self.helper.make_node(op_type, list(inputs), [name], **attrs))
        if out is not None:
            self.outputs.append(self.helper.make_tensor_value_info(out, self.elem, None))
        return name

    def session(self, name: str) -> ort.InferenceSession:
        graph = self.helper.make_graph(
            self.nodes, name, self.inputs, self.outputs, initializer=self.inits
        )
        return _session(self.device, graph)


def _onnx(purpose: str):
    try:
        import onnx  # only device execution needs it
        import onnx.numpy_helper
        from onnx import helper
    except ImportError:  # pragma: no cover - the gpu extra installs it
        raise UnsupportedError(f"{purpose} needs the onnx package (pip install onnx)") from None
    return onnx, helper


def _elem(data_type: str, device: Device) -> int:
    from onnx import TensorProto

    elem = {
        "tensor(float)": TensorProto.FLOAT,
        "tensor(float16)": TensorProto.FLOAT16,
        "tensor(bfloat16)": TensorProto.BFLOAT16,
        "tensor(int64)": TensorProto.INT64,
        "tensor(int32)": TensorProto.INT32,
    }.get(data_type)
    if elem is None:
        raise ModelError(f"cannot move a {data_type} tensor on {device}")
    return elem


def _session(device: Device, graph) -> ort.InferenceSession:
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    provider = next(ep for ep, kind in EP_DEVICES.items() if kind == device.kind)
    options = [{}] if device.host else [{"device_id": str(device.id)}]
    return ort.InferenceSession(
        model.SerializeToString(), providers=[provider], provider_options=options
    )
