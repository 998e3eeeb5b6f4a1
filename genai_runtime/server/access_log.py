"""One access line per HTTP request, and the log handler ``genai-runtime serve`` installs.

A line says method, path, status, tokens (prompt+completion, when the request generated) and
milliseconds, plus the names of request fields that were ignored, e.g.
``POST /v1/chat/completions 200 tokens 31+12 84 ms ignored: foo``. Never prompt or output text;
paths and field names are escaped so a request cannot forge a line.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, MutableMapping
from typing import Any, TextIO

from ..config.bounded import clip_text
from ..errors import GenaiRuntimeError

access = logging.getLogger("genai_runtime.server.access")

LOG_LEVELS = ("debug", "info", "warning", "error")
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_MAX_SHOWN = 120
_HANDLER_NAME = "genai_runtime.serve"

Scope = MutableMapping[str, Any]


def shown(text: str) -> str:
    """``text`` for one log line: control and non-ASCII characters escaped, cut short."""
    return clip_text(ascii(text)[1:-1], _MAX_SHOWN)


def note_usage(scope: Scope, usage: dict[str, Any]) -> None:
    """Record a finished request's token counts for its access line."""
    scope.setdefault("state", {})["access_usage"] = usage


def note_ignored(scope: Scope, names: tuple[str, ...]) -> None:
    """Record the names of request fields that were ignored, for the access line."""
    scope.setdefault("state", {})["access_ignored"] = names


class AccessLog:
    """ASGI middleware that logs each HTTP request once it has been answered."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 0

        async def send_status(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        except Exception:
            status = status or 500
            raise
        finally:
            if access.isEnabledFor(logging.INFO):
                access.info("%s", _line(scope, status or 499, time.perf_counter() - start))


def _line(scope: Scope, status: int, seconds: float) -> str:
    state = scope.get("state") or {}
    parts = [shown(scope.get("method", "")), shown(scope.get("path", "")), str(status)]
    usage = state.get("access_usage")
    if usage:
        parts.append(f"tokens {usage['prompt_tokens']}+{usage['completion_tokens']}")
    parts.append(f"{seconds * 1000:.0f} ms")
    ignored = state.get("access_ignored")
    if ignored:
        names = ", ".join(shown(n) for n in ignored[:20])
        parts.append(f"ignored: {names}" + (", ..." if len(ignored) > 20 else ""))
    return " ".join(parts)


def configure_logging(level: str = "info", stream: TextIO | None = None) -> logging.Handler:
    """Send ``genai_runtime``'s log records (access lines included) to ``stream`` (stderr) at
    ``level``; returns the handler, so a caller can remove it again."""
    if level not in LOG_LEVELS:
        raise GenaiRuntimeError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler.set_name(_HANDLER_NAME)
    logger = logging.getLogger("genai_runtime")
    for old in [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]:
        logger.removeHandler(old)  # configured again: replace, never print twice
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False  # uvicorn may configure the root logger too: print each line once
    return handler


def remove_logging(handler: logging.Handler) -> None:
    """Undo ``configure_logging``: remove its handler and let records propagate again."""
    logger = logging.getLogger("genai_runtime")
    logger.removeHandler(handler)
    logger.propagate = True
