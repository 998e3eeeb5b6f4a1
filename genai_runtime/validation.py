"""Argument checks for the public API, and the per-object lock that serializes its calls.

Every public entry point is reachable from user code with any Python value; these helpers turn
a wrong type or value into a ``GenaiRuntimeError`` subclass that names the argument, instead of
whatever numpy or onnxruntime would raise deep inside (or, worse, accept).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from .checks import is_integer
from .config.bounded import clip_text
from .errors import GenaiRuntimeError, GenerationError

T = TypeVar("T", bound=type)
ErrorType = type[GenaiRuntimeError]


def shown(value: Any) -> str:
    """A value for an error message: its type and a short repr."""
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__ must not replace the real error
        text = "<unprintable>"
    return f"{type(value).__name__} {clip_text(text, 60)}"


def as_index(value: Any, name: str, error: ErrorType = GenerationError) -> int:
    """An integer argument (Python or numpy int, not bool)."""
    if not is_integer(value):
        raise error(f"{name}: expected an integer, got {shown(value)}")
    return int(value)


def as_name(value: Any, name: str, error: ErrorType = GenerationError) -> str:
    if not isinstance(value, str):
        raise error(f"{name}: expected a string, got {shown(value)}")
    return value


def as_array(value: Any, name: str, error: ErrorType = GenerationError) -> np.ndarray:
    """A numeric (bool, integer or floating) array from ``value``; ragged lists, strings and
    objects are refused."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise error(f"{name}: expected a numeric array, got {shown(value)} ({exc})") from None
    if array.dtype.kind not in "biuf":
        raise error(f"{name}: expected a numeric array, got {shown(value)} (dtype {array.dtype})")
    return array


def serialized(cls: T) -> T:
    """Give every public method of ``cls`` one re-entrant lock per instance.

    Two threads sharing an object then take turns call by call instead of interleaving inside
    a forward pass (which corrupts the KV cache and sequence). The lock is made in ``__init__``.
    """
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._lock = threading.RLock()
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    for attr, member in list(vars(cls).items()):
        if getattr(member, "unlocked", False):
            continue
        if callable(member) and (attr == "__next__" or not attr.startswith("_")):
            setattr(cls, attr, _locked(member))
    return cls


def unlocked(method: Callable[..., Any]) -> Callable[..., Any]:
    """Leave ``method`` out of ``serialized``'s lock: it must act while another thread is inside
    a locked call (stopping a run in flight)."""
    method.unlocked = True  # type: ignore[attr-defined]
    return method


def _locked(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return call
