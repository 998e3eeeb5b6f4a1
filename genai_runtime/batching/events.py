"""What ``Engine.run`` hands back: ``EngineEvent``s (with ``TurnUsage``) in a reusable
``EngineEventBuffer``, and the engine's ``EngineCapabilities`` (onnxruntime-genai 0.18 names).

Events are small immutable records: unlike the reference's borrowed views they stay valid after
the next ``run``, so copying them out is never needed (it does no harm either).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .options import EngineError, EngineErrorCode, EngineEventFlags, FinishReason


@dataclass(frozen=True, slots=True)
class TurnUsage:
    """Token counts of one turn: the input ``begin_turn`` took, the tokens it generated, and how
    many of that input were copied from the engine's prompt cache instead of run (the
    reference's CPU engine has no prompt cache and reports 0); with speculation, the drafted
    tokens its passes verified and how many of them it kept."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    cached_prompt_tokens: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0


NO_USAGE = TurnUsage()


@dataclass(frozen=True, slots=True)
class EngineEvent:
    """One thing that happened to a turn. Check ``flags``: ``TOKEN`` carries ``token``;
    ``TURN_FINISHED`` carries ``finish_reason``, ``usage`` and, for ``STOP_STRING``, the
    ``matched_stop_string_index``; both can be set on one event (the turn's last token)."""

    flags: EngineEventFlags
    request: Any  # the Request object the caller holds (the same object, not a copy)
    turn_id: int
    token: int | None = None
    finish_reason: FinishReason = FinishReason.NONE
    matched_stop_string_index: int | None = None
    error_code: EngineErrorCode = EngineErrorCode.NONE
    usage: TurnUsage = NO_USAGE


@dataclass(frozen=True, slots=True)
class EngineCapabilities:
    """What the engine schedules: the batch size it was configured with, and the longest request
    and the token budget per step (0: not limited beyond the model's own length)."""

    configured_max_batch_size: int
    max_request_length: int = 0
    max_scheduled_tokens: int = 0


class EngineEventBuffer:
    """Room for up to ``capacity`` events, filled by each ``Engine.run`` of the engine that made
    it (``Engine.create_event_buffer``); a read-only sequence of the events of the last run."""

    def __init__(self, engine: Any, capacity: int):
        self._engine = weakref.ref(engine)  # it does not keep its engine alive
        self.capacity = capacity
        self._events: list[EngineEvent] = []

    def bound_to(self, engine: Any) -> bool:
        return self._engine() is engine

    def fill(self, events: list[EngineEvent]) -> None:
        """Replace the buffer's events (the engine's ``run`` calls this)."""
        if len(events) > self.capacity:
            raise EngineError(f"{len(events)} events do not fit a buffer of {self.capacity}")
        self._events = events

    def __len__(self) -> int:
        return len(self._events)

    def __getitem__(self, index: int) -> EngineEvent:
        return self._events[index]

    def __iter__(self) -> Iterator[EngineEvent]:
        return iter(self._events)

    def __repr__(self) -> str:
        return f"EngineEventBuffer({len(self._events)} of {self.capacity} events)"
