"""uvicorn's HTTP/1.1 protocol with a deadline for request heads (slow-loris clients).

uvicorn closes a kept-alive connection that stays idle, but a client that opens a connection
(or starts its next request) and then stalls in the middle of the headers holds it forever.
Here such a connection is closed once ``head_timeout`` seconds pass without a complete request
head. A stalled body is the app's business: it reads bodies under its own deadline.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["with_head_timeout"]


class _HeadTimeoutProtocol(H11Protocol):
    head_timeout = 30.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._watch_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_watching()
        super().connection_lost(exc)

    def _watch_head(self) -> None:
        # h11 says IDLE until a whole request head has arrived (part of one may be buffered).
        # An idle kept-alive connection gets here only when bytes arrive: then a head started.
        waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if not waiting:
            self._stop_watching()
        elif self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_overdue)

    def _stop_watching(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def with_head_timeout(seconds: float) -> type[H11Protocol]:
    """An h11 protocol class for ``uvicorn.Config(http=...)`` closing stalled request heads."""
    return type("HeadTimeoutH11", (_HeadTimeoutProtocol,), {"head_timeout": float(seconds)})
