"""Stop strings over decoded text: which one a sequence's output completes, and where.

Both engines match the same way: text is fed as it is decoded; among the stops a new piece
completes, the match that ends first wins, then the one that starts first (the longest), then
the lowest index (onnxruntime-genai's Engine rule). Only the last ``longest stop - 1``
characters are kept between pieces, so memory does not grow with the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ..errors import GenerationError

MAX_STOP_STRINGS = 16
MAX_STOP_BYTES = 16 * 1024


class StopStringError(GenerationError, ValueError):
    """A stop-string list the engines cannot match (empty entry, too many, too long, NUL)."""


def check_stop_strings(stops: Sequence[str]) -> tuple[str, ...]:
    """The list as a tuple, or ``StopStringError`` saying what is wrong with it."""
    if isinstance(stops, str) or not isinstance(stops, Sequence):
        raise StopStringError(f"stop strings must be a list of str, got {type(stops).__name__}")
    if len(stops) > MAX_STOP_STRINGS:
        raise StopStringError(
            f"Too many stop strings: {len(stops)}, the maximum is {MAX_STOP_STRINGS}."
        )
    total = 0
    for i, stop in enumerate(stops):
        if not isinstance(stop, str):
            raise StopStringError(f"Stop string at index {i} is not a str: {stop!r}")
        if not stop:
            raise StopStringError(f"Stop string at index {i} is empty.")
        if "\0" in stop:
            raise StopStringError("Stop strings must not contain an embedded NUL byte.")
        total += len(stop.encode("utf-8", "surrogatepass"))
    if total > MAX_STOP_BYTES:
        raise StopStringError(f"Stop strings total {total} bytes, the maximum is {MAX_STOP_BYTES}.")
    return tuple(stops)


class StopMatch(NamedTuple):
    index: int  # which stop string
    start: int  # where it starts, counted in characters of all the text fed so far


class StopMatcher:
    """Feed decoded pieces; the first piece that completes a stop string returns its match."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self._keep = max((len(s) for s in self.stops), default=1) - 1
        self._tail = ""
        self._fed = 0  # characters fed before ``_tail`` begins

    def feed(self, piece: str) -> StopMatch | None:
        if not self.stops or not piece:
            return None
        text = self._tail + piece
        old = len(self._tail)
        best: tuple[int, int, int] | None = None  # (end, start, index)
        for index, stop in enumerate(self.stops):
            at = text.find(stop, max(0, old - len(stop) + 1))
            if at >= 0:
                key = (at + len(stop), at, index)
                if best is None or key < best:
                    best = key
        base = self._fed
        cut = max(0, len(text) - self._keep)
        self._tail = text[cut:]
        self._fed += cut
        return None if best is None else StopMatch(best[2], base + best[1])


def pending_stop_prefix(text: str, stops: Sequence[str]) -> int:
    """Characters at the end of ``text`` that could still grow into a stop string (a streaming
    reply holds them back)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(text), len(stop) - 1), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest
