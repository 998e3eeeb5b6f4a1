"""Type checks every layer shares: in JSON and in Python, ``True`` is not the number 1."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np


def is_integer(value: Any) -> bool:
    """A Python or numpy integer, never a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


def is_number(value: Any) -> bool:
    """A real number (int or float, Python or numpy), never a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)
