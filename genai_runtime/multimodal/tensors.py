"""``og.Tensor`` and ``og.NamedTensors``: named model inputs, as onnxruntime-genai passes them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import GenerationError


class Tensor:
    """A NumPy array with the reference's accessors (``shape()``, ``type()``, ``as_numpy()``)."""

    def __init__(self, array: Any):
        if isinstance(array, Tensor):
            array = array.as_numpy()
        # A copy, as the reference's: later changes to the caller's array do not leak in.
        data = np.array(array, copy=True, order="C")
        if data.dtype == object or data.dtype.kind in "USV":
            raise GenerationError(f"og.Tensor: expected a numeric array, got dtype {data.dtype}")
        self._array = data

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def type(self) -> str:
        return str(self._array.dtype)

    def data(self) -> np.ndarray:
        return self._array

    def as_numpy(self) -> np.ndarray:
        return self._array

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self._array if dtype is None else self._array.astype(dtype)

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape()}, type={self.type()})"


class NamedTensors:
    """Ordered name -> Tensor: what ``processor(...)`` returns and ``set_inputs`` takes."""

    def __init__(self, items: dict[str, Any] | None = None):
        self._items: dict[str, Tensor] = {}
        for name, value in (items or {}).items():
            self[name] = value

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._items:  # the reference's message
            raise GenerationError(f"Tensor with name: {name} not found.")
        return self._items[name]

    def __setitem__(self, name: str, value: Any) -> None:
        if not isinstance(name, str) or not name:
            raise GenerationError(f"NamedTensors: tensor names are non-empty strings, got {name!r}")
        self._items[name] = value if isinstance(value, Tensor) else Tensor(value)

    def __delitem__(self, name: str) -> None:
        self._items.pop(name, None)  # as the reference: deleting a missing name is a no-op

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def keys(self) -> list[str]:
        return list(self._items)

    def items(self) -> list[tuple[str, Tensor]]:
        return list(self._items.items())

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}: {v.shape()} {v.type()}" for k, v in self._items.items())
        return f"NamedTensors({inner})"
