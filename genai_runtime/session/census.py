"""A count of what the runtime asks of a device: allocations, copies each way, session runs.

Every device-side move the runtime makes goes through ``Device`` or ``BoundSession``, which
record it here; a benchmark or test reads the difference over a stretch of decode steps
(``measure``). Counting is a few integer additions per event, cheap enough to stay on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any


@dataclass
class Census:
    device_allocations: int = 0  # tensors the runtime (or onnxruntime, for an output) makes there
    host_to_device: int = 0  # copies
    host_to_device_bytes: int = 0
    device_to_host: int = 0
    device_to_host_bytes: int = 0
    session_runs: int = 0
    run_seconds: float = 0.0  # wall time inside onnxruntime's run

    def minus(self, other: Census) -> Census:
        return Census(
            **{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)}
        )

    def copy(self) -> Census:
        return Census(**{f.name: getattr(self, f.name) for f in fields(self)})


COUNTS = Census()  # process-wide: what every executor on every device did


def allocated(count: int = 1) -> None:
    COUNTS.device_allocations += count


def uploaded(nbytes: int) -> None:
    COUNTS.host_to_device += 1
    COUNTS.host_to_device_bytes += nbytes


def downloaded(nbytes: int) -> None:
    COUNTS.device_to_host += 1
    COUNTS.device_to_host_bytes += nbytes


def run(call: Callable[..., Any], *args: Any) -> None:
    """``call(*args)``, one session run on a device, counted with its wall time."""
    start = time.perf_counter()
    call(*args)
    COUNTS.session_runs += 1
    COUNTS.run_seconds += time.perf_counter() - start


@dataclass
class Measured:
    """What happened inside a ``measure`` block, plus its wall time (host time outside
    onnxruntime = ``seconds - census.run_seconds``)."""

    census: Census
    seconds: float = 0.0

    @property
    def host_seconds(self) -> float:
        return self.seconds - self.census.run_seconds


@contextlib.contextmanager
def measure() -> Iterator[Measured]:
    """``with measure() as m: ...`` then ``m.census`` holds the block's counts."""
    before, start = COUNTS.copy(), time.perf_counter()
    result = Measured(Census())
    try:
        yield result
    finally:
        result.seconds = time.perf_counter() - start
        result.census = COUNTS.minus(before)
