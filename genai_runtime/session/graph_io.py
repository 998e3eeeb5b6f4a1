"""A session's declared inputs and outputs, read once from onnxruntime without running it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

_ORT_TYPES: dict[str, type] = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}

Dim = int | str | None

# A bool input with a default of false (an overridable initializer) that a decoder graph may
# take: true makes a multi-token pass compute logits at each row's last real token only, so a
# prompt pass skips the lm_head everywhere else. Graphs from our importer have it; a runtime
# that does not know it feeds nothing and gets every position's logits.
LAST_POSITION_SWITCH = "genai_runtime.last_position_only"


def takes_last_position_switch(session, logits: TensorInfo | None) -> bool:
    """Whether ``session``'s graph has the switch and ``[B, S, V]`` logits it can cut."""
    return (
        logits is not None
        and logits.rank == 3
        and any(a.name == LAST_POSITION_SWITCH for a in session.get_overridable_initializers())
    )


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: str  # onnxruntime's spelling, e.g. "tensor(float)"
    shape: tuple[Dim, ...]

    @property
    def dtype(self) -> np.dtype:
        if self.type not in _ORT_TYPES:
            raise TypeError(f"tensor {self.name!r} has unsupported type {self.type}")
        return np.dtype(_ORT_TYPES[self.type])

    @property
    def rank(self) -> int:
        return len(self.shape)

    def static_dim(self, axis: int) -> int | None:
        dim = self.shape[axis]
        return dim if isinstance(dim, int) and dim >= 0 else None

    def __str__(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.type}[{dims}]"


@dataclass(frozen=True)
class SessionIO:
    file: str
    inputs: Mapping[str, TensorInfo]
    outputs: Mapping[str, TensorInfo]
    path: str | None = None  # the .onnx file, for facts only its nodes state

    @classmethod
    def of(cls, session, file: str, path: str | None = None) -> SessionIO:
        def infos(args) -> dict[str, TensorInfo]:
            return {a.name: TensorInfo(a.name, a.type, tuple(a.shape)) for a in args}

        return cls(file, infos(session.get_inputs()), infos(session.get_outputs()), path)
