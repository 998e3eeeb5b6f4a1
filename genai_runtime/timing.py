"""Timing one generation phase by phase (prefill, first token, decode) and the process's peak RSS.

Used by ``genai-runtime run`` (its stats line) and ``bench``; only generator calls are timed, so
printing the text never counts.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Timing:
    """One generation's timings, in seconds; decode covers the tokens after the first."""

    prompt_tokens: int
    new_tokens: int
    prefill_s: float
    first_token_s: float
    decode_s: float

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else float("inf")

    @property
    def decode_tok_s(self) -> float | None:
        if self.new_tokens < 2:
            return None
        return (self.new_tokens - 1) / self.decode_s if self.decode_s > 0 else float("inf")

    @property
    def ttft_ms(self) -> float:
        return (self.prefill_s + self.first_token_s) * 1000.0

    def line(self) -> str:
        """The one-line summary ``run`` prints on stderr."""
        decode = f"{self.decode_tok_s:.1f} tok/s" if self.decode_tok_s is not None else "n/a"
        return (
            f"prompt tokens: {self.prompt_tokens} | prefill: {self.prefill_tok_s:.1f} tok/s | "
            f"decode: {decode} ({self.new_tokens} new tokens) | "
            f"time to first token: {self.ttft_ms:.1f} ms"
        )


def timed_generate(
    generator: Any,
    ids: np.ndarray,
    on_token: Callable[[int], bool | None] | None = None,
    limit: int | None = None,
) -> Timing:
    """Append the prompt and generate until done (or ``limit`` tokens, or ``on_token`` returns
    True), timing each phase."""
    start = time.perf_counter()
    generator.append_tokens(ids)
    prefill = time.perf_counter() - start
    first = decode = 0.0
    count = 0
    while not generator.is_done() and (limit is None or count < limit):
        tick = time.perf_counter()
        generator.generate_next_token()
        spent = time.perf_counter() - tick
        if count == 0:
            first = spent
        else:
            decode += spent
        count += 1
        if on_token is not None and on_token(int(generator.get_next_tokens()[0])):
            break
    return Timing(len(ids), count, prefill, first, decode)


def peak_rss_mib() -> float:
    """Peak resident set size of this process (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024
