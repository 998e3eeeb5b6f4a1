"""A session with its IOBinding: inputs and outputs bound once, rebound only when they change
(on the host), or staged in device tensors that stay bound and take new contents in place (on a
device, which would copy a host input when it is bound: a new allocation and copy every time)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from . import census
from .device import Device
from .graph_io import SessionIO

# Distinct shapes staged per input before the oldest are dropped (a prompt pass's ids, a decode
# step's ids: each keeps its device tensor across turns).
_STAGED_SHAPES = 4


class BoundSession:
    """One stage's session plus its IOBinding.

    Arrays bound by pointer must outlive the binding, so the owner keeps them (the caches and
    the executor hold preallocated buffers). ``output(name)`` reads an ORT-allocated output of
    the last run without copying.

    The per-token calls (bind by pointer, run) go straight to onnxruntime's C++ binding when it
    is reachable: its Python wrappers add WebGPU graph-capture bookkeeping that costs tens of
    microseconds per call and does nothing on CPU. The public API is the fallback.
    """

    def __init__(self, name: str, session: ort.InferenceSession, io: SessionIO, run_options=None):
        self.name = name
        self.session = session
        self.io = io
        self.device = Device.of(session)
        self.binding = session.io_binding()
        self.run_options = run_options
        self.kv_epoch = -1  # which generation of KV buffers this binding holds (caches use it)
        self._out_index: dict[str, int] = {}
        self._outputs = None
        self._fed: dict[str, tuple[int, tuple[int, ...]]] = {}  # input -> (pointer, shape) bound
        self._same: dict[str, np.ndarray] = {}  # input -> the array object fed last
        # On a device: per input, its device tensors by (shape, dtype), and the one bound now.
        self._staged: dict[str, dict[tuple, ort.OrtValue]] = {}
        self._staged_bound: dict[str, ort.OrtValue] = {}
        # Decode runs that replay a captured CUDA graph use these options (``run(graph=True)``).
        self.graph_options: ort.RunOptions | None = None
        try:
            self._c_binding = self.binding._iobinding
            self._c_session = session._sess
            self._c_device = ort.OrtDevice.make("cpu", 0)._get_c_device()
        except AttributeError:  # a future onnxruntime without these internals
            self._c_binding = None

    def feed(self, name: str, array: np.ndarray) -> None:
        """A host array the runtime (re)wrote for this pass. The CPU provider reads a bound
        array at run time, so an array already bound at the same address and shape stays bound;
        on a device its contents are copied into a device tensor of its shape that stays bound
        at one address (no allocation after the first pass of a shape)."""
        if self.device.copies_inputs:
            self._stage(name, array)
            return
        if self._same.get(name) is array:
            return  # the very array bound last pass (a decode step's ids buffer): nothing to do
        key = (array.__array_interface__["data"][0], array.shape)
        if self._fed.get(name) != key:
            self.bind_array(name, array)
            self._fed[name] = key
        self._same[name] = array

    def _stage(self, name: str, array: np.ndarray) -> None:
        value = self._staged_value(name, array)
        if self._staged_bound.get(name) is not value:
            self.binding.bind_ortvalue_input(name, value)
            self._staged_bound[name] = value
        self._same[name] = array

    def _staged_value(self, name: str, array: np.ndarray) -> ort.OrtValue:
        """The device tensor of ``array``'s shape for ``name``, holding its contents."""
        tensors = self._staged.setdefault(name, {})
        key = (array.shape, array.dtype)
        value = tensors.get(key)
        if value is None:
            if len(tensors) >= _STAGED_SHAPES:
                tensors.clear()
            value = tensors[key] = self.device.upload(array)
        elif not (self._same.get(name) is array and not array.flags.writeable):
            self.device.update(value, array)  # (a read-only array fed again cannot have changed)
        return value

    def feed_prefix(self, name: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
        """Feed the first ``prod(shape)`` elements of the C-contiguous ``array`` as a tensor of
        ``shape``. On a device ``array`` keeps one staged tensor (its shape never changes, so
        nothing is allocated per pass) and the input is bound to its leading elements by
        address: an input that grows every step (an attention mask) keeps its true shape, which
        kernels read (attention splits its work by the mask's width)."""
        if not self.device.copies_inputs:
            self.feed(name, array.reshape(-1)[: int(np.prod(shape))].reshape(shape))
            return
        value = self._staged_value(name, array)
        self._same[name] = array
        self._staged_bound.pop(name, None)
        kind, index = self.device.kind, self.device.id
        self.binding.bind_input(name, kind, index, array.dtype, list(shape), value.data_ptr())

    def bind_array(self, name: str, array: np.ndarray) -> None:
        """Bind a C-contiguous host array: by pointer on the host (no copy; the caller keeps it
        alive), copied to the session's device there."""
        self._fed.pop(name, None)
        self._same.pop(name, None)
        self._staged_bound.pop(name, None)
        if self.device.copies_inputs:  # a private device copy: a later rewrite is unseen
            self.binding.bind_ortvalue_input(name, self.device.upload(array))
            return
        pointer = array.__array_interface__["data"][0]
        if self._c_binding is not None:
            self._c_binding.bind_input(name, self._c_device, array.dtype, array.shape, pointer)
        else:
            self.binding.bind_input(name, "cpu", 0, array.dtype, array.shape, pointer)

    def bind_value(self, name: str, value: ort.OrtValue) -> None:
        self._fed.pop(name, None)
        self._same.pop(name, None)
        self._staged_bound.pop(name, None)
        self.binding.bind_ortvalue_input(name, value)

    def bind_rows(
        self, name: str, value: ort.OrtValue, lo: int, hi: int, dtype: np.dtype, output: bool
    ) -> None:
        """Rows ``lo:hi`` (axis 0) of a ``dtype`` tensor on the session's device, bound by
        address: a batch's rows of one buffer read or written in place, nothing copied."""
        shape = value.shape()
        row = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dtype).itemsize
        pointer, shape = value.data_ptr() + lo * row, [hi - lo, *shape[1:]]
        kind, index = self.device.kind, self.device.id
        if output:
            self._index(name)
            self.binding.bind_output(name, kind, index, dtype, shape, pointer)
            return
        self._fed.pop(name, None)
        self._same.pop(name, None)
        self._staged_bound.pop(name, None)
        self.binding.bind_input(name, kind, index, dtype, shape, pointer)

    def bind_output_array(self, name: str, array: np.ndarray) -> None:
        self._index(name)
        pointer = array.__array_interface__["data"][0]
        if self._c_binding is not None:
            shape = list(array.shape)
            self._c_binding.bind_output(name, self._c_device, array.dtype, shape, pointer)
        else:
            self.binding.bind_output(name, "cpu", 0, array.dtype, list(array.shape), pointer)

    def bind_output_value(self, name: str, value: ort.OrtValue) -> None:
        self._index(name)
        self.binding.bind_ortvalue_output(name, value)

    def bind_output_alloc(self, name: str) -> None:
        """Let onnxruntime allocate this output on the session's device (its shape is only
        known after the run); a wire or cache then feeds it on without a copy."""
        self._index(name)
        if not self.device.host:
            census.allocated()  # onnxruntime allocates it there on every run
        self.binding.bind_output(name, self.device.kind, self.device.id)

    def run(self, graph: bool = False) -> None:
        """One run; ``graph``: a decode step that captures, then replays, a CUDA graph."""
        self._outputs = None
        options = self.graph_options if graph else self.run_options
        if self._c_binding is not None:
            call, binding = self._c_session.run_with_iobinding, self._c_binding
        else:
            call, binding = self.session.run_with_iobinding, self.binding
        if self.device.host:  # the census counts what a device is asked; nothing added here
            call(binding, options)
        else:
            census.run(call, binding, options)

    def output(self, name: str) -> ort.OrtValue:
        if self._outputs is None:
            self._outputs = self.binding.get_outputs()
        return self._outputs[self._out_index[name]]

    def _index(self, name: str) -> None:
        # onnxruntime keeps a rebound output at its first position, so indices are stable.
        self._out_index.setdefault(name, len(self._out_index))
