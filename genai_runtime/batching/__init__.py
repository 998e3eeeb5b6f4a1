"""Batched decoding shared by the OpenAI server and onnxruntime-genai 0.18's Engine API.

``slots`` (where sequences' caches live), ``core`` (advance rows, choose tokens), ``stops``
(stop-string matching); the 0.18 API itself in ``engine``, ``options`` and ``events``.
"""

from .engine import Engine, Request
from .events import EngineCapabilities, EngineEvent, EngineEventBuffer, TurnUsage
from .options import (
    EngineErrorCode,
    EngineEventFlags,
    FinishReason,
    RequestOptions,
    TurnOptions,
)

__all__ = [
    "Engine",
    "EngineCapabilities",
    "EngineErrorCode",
    "EngineEvent",
    "EngineEventBuffer",
    "EngineEventFlags",
    "FinishReason",
    "Request",
    "RequestOptions",
    "TurnOptions",
    "TurnUsage",
]
