"""Freed heap handed back after large requests.

glibc's allocator keeps the pages a large request freed (a 1 MiB body parsed, tokenized,
templated and refused), so a server that saw a few such requests stayed hundreds of MiB larger
for good. After a request whose body was large, ``malloc_trim(0)`` runs on a timer thread (never
two at a time, at most one per ``MIN_GAP_S``, the last of a burst always followed by one),
returning those pages to the system.
Elsewhere than glibc there is nothing to call and the middleware only passes requests on.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

BIG_BODY = 64 << 10  # bytes of request body that make a request "large"
MIN_GAP_S = 1.0  # seconds between two trims at least


def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim  # glibc only (musl has none)
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


class HeapTrim:
    """``malloc_trim(0)`` on request, on a timer thread: at once if none ran within
    ``MIN_GAP_S``, else once that gap has passed, so the last of a burst of large requests is
    always followed by one. Never two at a time, never more than one waiting."""

    def __init__(self, trim: Callable[[int], int] | None = None, gap_s: float = MIN_GAP_S):
        self._trim = trim if trim is not None else _malloc_trim()
        self._gap = gap_s
        self._lock = threading.Lock()
        self._last = -gap_s
        self._waiting = False
        self.count = 0  # trims run (for tests and logs)

    @property
    def available(self) -> bool:
        return self._trim is not None

    def request(self) -> None:
        """Trim soon (see the class); a request while one waits joins it."""
        with self._lock:
            if self._trim is None or self._waiting:
                return
            self._waiting = True
            delay = max(0.0, self._last + self._gap - time.monotonic())
        timer = threading.Timer(delay, self._run)
        timer.daemon = True
        timer.start()

    def _run(self) -> None:
        try:
            self._trim(0)
        finally:
            with self._lock:
                self._last = time.monotonic()
                self._waiting = False
                self.count += 1


class TrimAfterLargeRequests:
    """ASGI middleware: after an HTTP request whose body reached ``BIG_BODY`` bytes has been
    answered, schedule one heap trim on a worker thread."""

    def __init__(self, app: Any, heap: HeapTrim | None = None):
        self.app = app
        self.heap = heap if heap is not None else HeapTrim()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or not self.heap.available:
            await self.app(scope, receive, send)
            return
        seen = 0

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            return message

        try:
            await self.app(scope, counted, send)
        finally:
            if seen >= BIG_BODY:
                self.heap.request()
