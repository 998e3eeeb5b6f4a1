"""The bounds on a checkpoint's hyper-parameters: one table for the GGUF and the Hugging Face
import.

A checkpoint is untrusted input, and its hyper-parameters size what the importer builds (a
name per layer and tensor, rope factors per dimension) and what the runtime allocates (rope
tables and caches of ``context`` rows, ``window`` of them per local layer). Each reader maps its
own keys to the bounds here (``gguf_checks.ARCH_KEYS``, ``hf_checks.CONFIG_KEYS``) and checks
every value it reads before anything is sized from it, so both refuse the same values in the
same words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


def is_int(value: Any) -> bool:
    """An integer, not a bool (JSON ``true`` must not read as 1 layer)."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def is_number(value: Any) -> bool:
    return is_int(value) or isinstance(value, float | np.floating)


def shown(value: Any) -> str:
    """A value's type and a clipped repr, for messages (a 16 MiB list must not make one)."""
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


@dataclass(frozen=True)
class Bound:
    """One hyper-parameter's type (integer or finite number) and range."""

    low: float
    high: float
    integer: bool = True
    open_low: bool = False  # ``low`` itself refused (a rope base or epsilon of 0)

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` (None: nothing)."""
        if self.integer:
            if not is_int(value):
                return f"expected an integer, got {shown(value)}"
            if not self.low <= value <= self.high:
                return f"expected an integer between {self.low} and {self.high}, got {value}"
            return None
        if not is_number(value) or not math.isfinite(value):
            return f"expected a finite number, got {shown(value)}"
        if value > self.high or value < self.low or (self.open_low and value == self.low):
            floor = f"> {self.low}" if self.open_low else f">= {self.low}"
            return f"expected a number {floor} and <= {self.high}, got {value}"
        return None


@dataclass(frozen=True)
class ShapeBounds:
    """The table: each quantity a checkpoint states, and the values the importer accepts (every
    upper bound is far past any released model; the lower ones keep divisions and logs finite)."""

    layers: Bound = Bound(1, 4096)
    heads: Bound = Bound(1, 1 << 12)
    kv_heads: Bound = Bound(1, 1 << 12)
    head_size: Bound = Bound(1, 1 << 12)
    hidden: Bound = Bound(1, 1 << 18)
    ffn: Bound = Bound(1, 1 << 18)
    vocab: Bound = Bound(1, 1 << 24)
    # The runtime allocates rope tables and caches of this many rows.
    context: Bound = Bound(1, 1 << 21)
    original_context: Bound = Bound(0, 1 << 21)  # 0: not stated
    window: Bound = Bound(0, 1 << 21)  # 0: every layer global
    layer_number: Bound = Bound(0, 4096)  # a layer index, or the period of a window pattern
    rope_dim: Bound = Bound(2, 1 << 12)
    rope_base: Bound = Bound(0.0, 1e12, integer=False, open_low=True)
    # Rope scaling factors, per-dimension factors and attention factors.
    rope_factor: Bound = Bound(0.0, 1e6, integer=False, open_low=True)
    rotary_fraction: Bound = Bound(0.0, 1.0, integer=False, open_low=True)
    norm_eps: Bound = Bound(0.0, 1.0, integer=False, open_low=True)
    softcap: Bound = Bound(0.0, 1e6, integer=False)  # 0: none
    query_scalar: Bound = Bound(0.0, 1e6, integer=False)  # 0: 1/sqrt(head_size)
    token_id: Bound = Bound(0, (1 << 24) - 1)


SHAPES = ShapeBounds()
