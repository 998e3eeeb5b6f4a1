"""Freed heap handed back after large requests.

glibc's allocator keeps the pages a large request freed (a 1 MiB body parsed, tokenized,
templated and refused), so a server that saw a few such requests stayed hundreds of MiB larger
for good. After a request whose body was large, ``malloc_trim(0)`` runs once on a worker thread
(never two at a time, at most one per ``MIN_GAP_S``), returning those pages to the system.
Elsewhere than glibc there is nothing to call and the middleware only passes requests on.
"""

from __future__ import annotations

import asyncio
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
    """Runs ``malloc_trim(0)`` on request, on a worker thread, one at a time."""

    def __init__(self, trim: Callable[[int], int] | None = None):
        self._trim = trim if trim is not None else _malloc_trim()
        self._lock = threading.Lock()
        self._last = 0.0
        self.count = 0  # trims run (for tests and logs)

    @property
    def available(self) -> bool:
        return self._trim is not None

    def run(self) -> bool:
        """Trim now unless one runs or ran within ``MIN_GAP_S``; whether it ran."""
        if self._trim is None or not self._lock.acquire(blocking=False):
            return False
        try:
            if time.monotonic() - self._last < MIN_GAP_S:
                return False
            self._trim(0)
            self._last = time.monotonic()
            self.count += 1
            return True
        finally:
            self._lock.release()


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
                asyncio.get_running_loop().run_in_executor(None, self.heap.run)
