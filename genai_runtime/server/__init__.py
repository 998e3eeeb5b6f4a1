"""OpenAI-compatible HTTP server (``genai-runtime serve``; needs the ``server`` extra).

``serve`` binds the socket first (so port 0 works and /health answers 503 while the model
loads), then loads the model in the background and starts the engine thread. A model that
cannot load stops ``serve`` with that error (a server answering 503 forever hides it).
"""

from __future__ import annotations

from .launch import (
    ServeOptions,
    ServerHandle,
    build_engine,
    check_adapter_names,
    check_limits,
    engine_over,
    is_loopback,
    serve,
)

__all__ = [
    "ServeOptions",
    "ServerHandle",
    "build_engine",
    "check_adapter_names",
    "check_limits",
    "engine_over",
    "is_loopback",
    "serve",
]
