"""A session with its IOBinding: inputs and outputs bound once, rebound only when they change."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from .graph_io import SessionIO


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
        self.binding = session.io_binding()
        self.run_options = run_options
        self.kv_epoch = -1  # which generation of KV buffers this binding holds (caches use it)
        self._out_index: dict[str, int] = {}
        self._outputs = None
        try:
            self._c_binding = self.binding._iobinding
            self._c_session = session._sess
            self._c_device = ort.OrtDevice.make("cpu", 0)._get_c_device()
        except AttributeError:  # a future onnxruntime without these internals
            self._c_binding = None

    def bind_array(self, name: str, array: np.ndarray) -> None:
        """Bind a C-contiguous array by pointer (no copy; the caller keeps it alive)."""
        pointer = array.__array_interface__["data"][0]
        if self._c_binding is not None:
            self._c_binding.bind_input(name, self._c_device, array.dtype, array.shape, pointer)
        else:
            self.binding.bind_input(name, "cpu", 0, array.dtype, array.shape, pointer)

    def bind_value(self, name: str, value: ort.OrtValue) -> None:
        self.binding.bind_ortvalue_input(name, value)

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
        """Let onnxruntime allocate this output (its shape is only known after the run)."""
        self._index(name)
        self.binding.bind_output(name, "cpu")

    def run(self) -> None:
        self._outputs = None
        if self._c_binding is not None:
            self._c_session.run_with_iobinding(self._c_binding, self.run_options)
        else:
            self.session.run_with_iobinding(self.binding, self.run_options)

    def output(self, name: str) -> ort.OrtValue:
        if self._outputs is None:
            self._outputs = self.binding.get_outputs()
        return self._outputs[self._out_index[name]]

    def _index(self, name: str) -> None:
        # onnxruntime keeps a rebound output at its first position, so indices are stable.
        self._out_index.setdefault(name, len(self._out_index))
