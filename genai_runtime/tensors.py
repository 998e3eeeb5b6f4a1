"""``Tensor`` and ``NamedTensors``: onnxruntime-genai's containers for named model inputs.

A ``Tensor`` owns a C-contiguous copy of the array it was made from (as the reference's does), so
later changes to the caller's array do not leak into a generator.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from .errors import GenaiRuntimeError


class Tensor:
    def __init__(self, array: Any):
        data = np.array(array, copy=True, order="C")
        if data.dtype == object or data.dtype.kind in "USV":
            raise GenaiRuntimeError(f"Tensor: expected a numeric array, got dtype {data.dtype}")
        self._array = data

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def type(self) -> np.dtype:
        return self._array.dtype

    def data(self) -> memoryview:
        return memoryview(self._array)

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape()}, dtype={self._array.dtype})"


class NamedTensors:
    """Tensors by input name; assigning a NumPy array wraps it in a ``Tensor``."""

    def __init__(self) -> None:
        self._tensors: dict[str, Tensor] = {}

    def __setitem__(self, name: str, value: Any) -> None:
        if not isinstance(name, str):
            raise GenaiRuntimeError(f"NamedTensors: names are strings, got {name!r}")
        self._tensors[name] = value if isinstance(value, Tensor) else Tensor(value)

    def __getitem__(self, name: str) -> Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise GenaiRuntimeError(f"Tensor with name: {name} not found.") from None

    def __delitem__(self, name: str) -> None:
        self._tensors.pop(name, None)  # as the reference: deleting a missing name is a no-op

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __len__(self) -> int:
        return len(self._tensors)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._tensors))

    def keys(self) -> list[str]:
        return list(self._tensors)
