"""onnxruntime-genai 0.18's Engine API on the batched decode core: ``Engine``, ``Request``.

A ``Request`` is one resident conversation; each ``begin_turn`` appends input tokens and
generates until end-of-sequence, a stop string, the turn's or the session's token limit, or a
``cancel_turn``. ``Engine.run(buffer)`` either hands out events already made or runs one step
and hands out that step's events; nothing runs in the background.

Scheduling follows the reference's static batch, because with int4 weights a row's results
depend on whether its pass ran one row or several: requests begun before a step form one batch
(up to ``MAX_BATCH``) and decode together, every pass covering the whole batch (finished rows
included); a later request waits for the batch to finish; a turn continued by a member joins its
batch. Beyond the reference: continuation works in batches of several requests, every request
stays resident while slots last (an evicted one re-runs its tokens on its next turn), and stop
strings, per-turn seeds and rewinds work on every model.

Also beyond it, a prompt cache (``batching.prompt_cache``, in memory) shared by the engine's
requests: a request placed in a slot copies the rows of the longest cached prefix of its tokens
instead of prefilling them (``TurnUsage.cached_prompt_tokens`` counts them), and offers the rows
its prefills computed. Only prefill rows are cached or copied, and at least two tokens are still
prefilled, so the copy changes no pass: with int4 weights a one-token pass rounds differently,
and a decode pass's rows depend on the batch it ran in.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import deque
from typing import Any

import numpy as np

from ..decoding.picker import TokenPicker
from ..decoding.processors import MinNewTokens
from ..decoding.sampling import make_rng
from ..decoding.stopping import StopPolicy, StopReason
from ..model import Model
from ..tokenizer import Tokenizer
from .core import DecodeCore, Row, TokenHistory
from .events import EngineCapabilities, EngineEvent, EngineEventBuffer, TurnUsage
from .options import (
    EngineError,
    EngineErrorCode,
    EngineEventFlags,
    EngineTypeError,
    EngineValueError,
    FinishReason,
    RequestHandle,
    RequestOptions,
    TurnOptions,
    TurnPolicy,
    resolve_turn,
    unsigned,
)
from .prompt_cache import BLOCK_TOKENS, DEFAULT_MEMORY_MB, PromptCache
from .prompt_files import DEFAULT_DISK_MB, open_prompt_cache
from .stops import StopMatcher

MAX_BATCH = 4  # the reference's static batch size

log = logging.getLogger("genai_runtime.batching")

TOKEN, FINISHED, FAILED = (
    EngineEventFlags.TOKEN,
    EngineEventFlags.TURN_FINISHED,
    EngineEventFlags.FAILED,
)

# The telemetry keys of the reference's get_speculative_stats (this engine drafts nothing).
_SPECULATIVE_STATS = [
    "rounds",
    "completed_rounds",
    "interrupted_rounds",
    "active_rounds",
    "draft_tokens_proposed",
    "draft_tokens_evaluated",
    "draft_tokens_accepted",
    "correction_tokens",
    "bonus_tokens",
    "tokens_queued",
    "tokens_emitted",
    "tokens_discarded",
    "tokens_buffered",
    "draft_forward_passes",
    "target_forward_passes",
    "effective_k",
    "full_accept_rounds",
    "partial_accept_rounds",
    "zero_accept_rounds",
]


# The reference's Engine: an EOS is never one of a turn's tokens, and a finished grammar's
# turn ends on the EOS the grammar forces next.
_STOP_POLICY = StopPolicy(eos_is_output=False, grammar_ends_row=False)
_FINISH = {
    StopReason.STOP_STRING: FinishReason.STOP_STRING,
    StopReason.BUDGET: FinishReason.MAX_GENERATED_TOKENS,
    StopReason.CONTEXT: FinishReason.MAX_SESSION_TOKENS,
}


class _Turn:
    def __init__(self, turn_id: int, policy: TurnPolicy, prompt_tokens: int, stops: Any, row: Row):
        self.id = turn_id
        self.row = row
        self.drafted_before, self.accepted_before = row.drafted, row.accepted
        self.policy = policy
        self.prompt_tokens = prompt_tokens
        self.cached = 0  # of its input tokens, copied from the prompt cache
        self.generated = 0
        self.grammar_done = False  # its grammar accepts nothing but end-of-sequence now
        self.stops: tuple[Any, StopMatcher] | None = stops  # (tokenizer stream, matcher)

    def usage(self) -> TurnUsage:
        row = self.row
        return TurnUsage(
            self.prompt_tokens, self.generated, self.cached,
            row.drafted - self.drafted_before, row.accepted - self.accepted_before,
        )  # fmt: skip


class _Session:
    """The engine's side of one Request."""

    CREATED, QUEUED, ACTIVE, COMPLETE, CLOSED = range(5)

    def __init__(self, handle: Request, row: Row, max_session: int):
        self.handle = weakref.ref(handle)
        self.row = row
        self.max_session = max_session
        self.state = _Session.CREATED
        self.turn: _Turn | None = None
        self.next_turn_id = 1
        self.turn_starts: dict[int, int] = {}  # turn id -> history length before its input
        self.last_used = 0
        # leading tokens whose rows in the slot came from prefills (or the prompt cache): what
        # the cache may take; a decode pass's rows depend on its batch, so they end it
        self.prefilled = 0


_KEY = object()  # only the engine makes Requests


class Request(RequestHandle):
    """One resident conversation of an ``Engine`` (``Engine.create_request``)."""

    def __init__(self, key: object, engine: Engine, session_args: tuple):
        if key is not _KEY:
            raise EngineTypeError("Requests are made with Engine.create_request")
        self._engine = engine
        self._session = _Session(self, *session_args)
        # dropping the last handle closes the request at the engine's next call
        weakref.finalize(self, _abandon, weakref.ref(engine), self._session)

    def begin_turn(self, tokens: Any, turn_options: TurnOptions | None = None) -> int:
        """Append ``tokens`` (one-dimensional ids) and generate; returns the turn id (1, 2, ...).
        Valid for a new request or once the current turn is complete and its events drained."""
        return self._engine.begin_turn(self, self._session, tokens, turn_options)

    def cancel_turn(self, turn_id: int) -> bool:
        """Cancel the queued or active turn ``turn_id``; False when it is not that turn (done,
        stale, unknown). Tokens already generated stay in the request."""
        return self._engine.cancel_turn(self._session, turn_id)

    def rewind_to_start_of_turn(self, turn_id: int) -> None:
        """Drop turn ``turn_id`` and every later one (input and output) from a request whose
        current turn is complete."""
        self._engine.rewind(self._session, turn_id)

    def set_draft_tokens(self, tokens: Any) -> None:
        """Propose the tokens expected after the request's tokens so far (a draft model's, say):
        its next decode pass verifies them, and the tokens it keeps equal those the request
        would generate without them. Needs ``Engine(model, speculate=N)``; at most N tokens."""
        self._engine.offer_drafts(self._session, tokens)

    def close(self) -> None:
        """End the request: its queued turn and undelivered events are dropped. Idempotent."""
        self._engine.close(self._session)


def _abandon(engine_ref: weakref.ref, session: _Session) -> None:
    engine = engine_ref()
    if engine is not None:
        engine.abandoned.append(session)


class Engine:
    """onnxruntime-genai 0.18's ``Engine(model)``: Requests, turns and events over one model.

    All calls come from the thread that made the engine (the reference's owner-thread rule).
    ``prompt_cache_mb``: the prompt cache's memory budget in MiB (0: none; see the module
    docstring); ``prompt_cache_note`` says what it is, or why there is none.
    """

    def __init__(
        self, model: Model, *, prompt_cache_mb: int = DEFAULT_MEMORY_MB, speculate: int = 0
    ):
        if not isinstance(model, Model):
            raise EngineTypeError(f"Engine expects a Model, got {type(model).__name__}")
        self._owner = threading.get_ident()
        self._model = model
        search = model.spec.generation
        self._search = search
        self._max_length = search.max_length
        self._core = DecodeCore(
            model, num_slots=MAX_BATCH, context=max(1, search.max_length), min_rows=1,
            stop_policy=_STOP_POLICY, speculate=unsigned("speculate", speculate, bits=5),
        )  # fmt: skip
        self._prompt_cache: PromptCache | None
        self._prompt_cache, self.prompt_cache_note = open_prompt_cache(
            model, self._core.slots, mb=unsigned("prompt_cache_mb", prompt_cache_mb, bits=20),
            folder=None, disk_mb=DEFAULT_DISK_MB, block=BLOCK_TOKENS, max_tokens=self._max_length,
        )  # fmt: skip
        self._vocab = model.vocab_size
        self._tokenizer: Tokenizer | None = None  # made for the first turn with stop strings
        self._events: deque[EngineEvent] = deque()
        self._queue: deque[_Session] = deque()  # sessions waiting for a batch
        self._batch: list[_Session] = []
        self._holders: list[_Session | None] = [None] * MAX_BATCH  # slot -> resident session
        self._clock = 0
        self._passes = 0
        self.abandoned: list[_Session] = []  # Requests whose last handle was dropped

    # -- the public API -------------------------------------------------------------------------

    def create_request(self, *, options: RequestOptions | None = None) -> Request:
        self._boundary()
        if options is not None and not isinstance(options, RequestOptions):
            raise EngineTypeError(f"options must be a RequestOptions, got {type(options).__name__}")
        search = self._search
        if search.max_length <= 0:
            raise EngineError("search.max_length must be greater than zero for the Engine.")
        if search.num_beams != 1:
            raise EngineError(
                "The Engine decodes one beam; the model sets search.num_beams = "
                f"{search.num_beams}. "
                'Overlay {"search": {"num_beams": 1}} on the Config before creating the Model.'
            )
        if search.min_length != 0:
            raise EngineError(
                f"search.min_length ({search.min_length}) must be 0 for the Engine; use "
                "TurnOptions.set_min_generated_tokens for a per-turn minimum."
            )
        limit = options.max_session_tokens if options is not None else 0
        if limit == 0:
            limit = search.max_length
        elif limit > search.max_length:
            raise EngineError(
                f"max_session_tokens ({limit}) must be greater than zero and no greater than the "
                f"model-configured search.max_length ({search.max_length})."
            )
        row = Row(TokenHistory(), None, make_rng(search.random_seed))
        return Request(_KEY, self, (row, limit))

    def create_event_buffer(self, capacity: int) -> EngineEventBuffer:
        self._check_owner()
        return EngineEventBuffer(self, unsigned("create_event_buffer", capacity, bits=63))

    def run(self, buffer: EngineEventBuffer) -> EngineEventBuffer:
        """Hand out events already made, or else run one step and hand out its events (at most
        ``capacity`` each call; the rest wait for the next call). Returns ``buffer``."""
        if not isinstance(buffer, EngineEventBuffer):
            raise EngineTypeError(f"run expects an EngineEventBuffer, got {type(buffer).__name__}")
        self._check_owner()
        if not buffer.bound_to(self):
            raise EngineError("buffer must be used with the Engine that created it.")
        buffer.fill([])
        if buffer.capacity == 0:
            return buffer
        self._boundary()
        if not self._events:
            self._step()
        n = min(buffer.capacity, len(self._events))
        buffer.fill([self._events.popleft() for _ in range(n)])
        return buffer

    def has_pending_requests(self) -> bool:
        """True while events wait to be handed out or a turn still has work."""
        self._boundary()
        return (
            bool(self._events)
            or bool(self._queue)
            or any(s.state == _Session.ACTIVE for s in self._batch)
        )

    def get_capabilities(self) -> EngineCapabilities:
        self._check_owner()
        return EngineCapabilities(configured_max_batch_size=MAX_BATCH)

    def get_speculative_stats(self) -> dict:
        """The reference's speculative telemetry keys. Without ``speculate`` this engine drafts
        nothing and only ``target_forward_passes`` counts; with it, the prompt-lookup drafts its
        verify passes checked (``rounds``: passes that verified drafts)."""
        stats: dict[str, Any] = dict.fromkeys(_SPECULATIVE_STATS, 0)
        stats["target_forward_passes"] = self._passes
        spec = self._core.speculation
        stats["rounds"] = stats["completed_rounds"] = spec.passes
        stats["draft_tokens_proposed"] = stats["draft_tokens_evaluated"] = spec.proposed
        stats["draft_tokens_accepted"] = spec.accepted
        stats["effective_k"] = self._core.speculate
        stats["acceptance_rate"] = spec.accepted / spec.proposed if spec.proposed else 0.0
        stats["acceptance_length_histogram"] = [0] * 8
        return stats

    def max_draft_tokens_per_proposal(self) -> int:
        return self._core.speculate

    @property
    def prompt_cache(self) -> PromptCache | None:
        """The engine's prompt cache (its ``stats`` count lookups and hits), if it has one."""
        return self._prompt_cache

    # -- Request operations (through Request's methods) ----------------------------------------

    def begin_turn(
        self, request: Request, s: _Session, tokens: Any, options: TurnOptions | None
    ) -> int:
        self._boundary()
        if s.state == _Session.CLOSED:
            raise EngineError("Cannot use a closed request.")
        if s.state in (_Session.QUEUED, _Session.ACTIVE):
            raise EngineError(
                "BeginTurn is only valid for a new request or after the current turn is complete."
            )
        self._core.offer(s.row, ())  # drafts proposed after the last turn follow no longer
        ids = self._token_array(tokens)
        if any(e.request is request for e in self._events):
            raise EngineError(
                "Cannot begin a turn while an event for this request is pending; drain it with "
                "Engine.run first."
            )
        if options is not None and (
            not isinstance(options, TurnOptions) or not options.bound_to(request)
        ):
            raise EngineError("Turn options belong to a different or destroyed Request.")
        history = s.row.history
        if len(history) + ids.size + 1 > s.max_session:
            raise EngineError(
                f"Appending input_tokens_count ({ids.size}) to current_sequence_length "
                f"({len(history)}) must leave room for at least one generated token before "
                f"max_session_tokens ({s.max_session})."
            )
        policy = resolve_turn(options, self._search, self._vocab)
        picker = self._picker(policy)  # compiles a grammar: may raise, still before any change
        stops = None
        if policy.stop_strings:
            if self._tokenizer is None:
                self._tokenizer = Tokenizer(self._model)
            stops = (self._tokenizer.create_stream(), StopMatcher(policy.stop_strings))
        # -- nothing above changed the request
        turn_id = s.next_turn_id
        s.next_turn_id += 1
        s.turn_starts[turn_id] = len(history)
        history.extend(ids)
        s.row.picker = picker
        picker.start(len(history))
        if policy.seed is not None:
            s.row.rng = make_rng(policy.seed % (1 << 63))
        s.turn = _Turn(turn_id, policy, int(ids.size), stops, s.row)
        if s in self._batch and s.row.slot >= 0:  # a resident member continues in its batch
            s.state = _Session.ACTIVE
        else:
            s.state = _Session.QUEUED
            self._queue.append(s)
        return turn_id

    def cancel_turn(self, s: _Session, turn_id: int) -> bool:
        self._boundary()
        if s.state == _Session.CLOSED:
            raise EngineError("Cannot cancel a turn of a closed request.")
        if s.next_turn_id == 1:
            raise EngineError("Cannot cancel a request before a turn has begun.")
        if not is_turn_id(turn_id) or s.turn is None or s.turn.id != turn_id:
            return False
        if s.state not in (_Session.QUEUED, _Session.ACTIVE):
            return False
        if s.state == _Session.QUEUED:
            self._queue.remove(s)
        s.row.logits = None
        self._finish(s, FinishReason.CANCELLED, merge=True)
        return True

    def rewind(self, s: _Session, turn_id: int) -> None:
        self._boundary()
        if s.state == _Session.CLOSED:
            raise EngineError("Cannot rewind a closed request.")
        if s.state in (_Session.QUEUED, _Session.ACTIVE):
            raise EngineError("Rewind needs the current turn to be complete (or cancelled) first.")
        self._core.offer(s.row, ())
        handle = s.handle()
        if any(e.request is handle for e in self._events):
            raise EngineError("Cannot rewind while an event for this request is pending.")
        if not is_turn_id(turn_id) or turn_id not in s.turn_starts:
            raise EngineError(
                f"Turn {turn_id!r} is not a turn of this request that can be rewound."
            )
        boundary = s.turn_starts[turn_id]
        s.turn_starts = {t: at for t, at in s.turn_starts.items() if t < turn_id}
        row = s.row
        row.history.truncate(boundary)
        row.processed = min(row.processed, boundary)
        s.prefilled = min(s.prefilled, boundary)
        row.logits = None
        if row.slot >= 0:
            self._core.slots.rewind(row.slot, row.processed)

    def offer_drafts(self, s: _Session, tokens: Any) -> None:
        self._boundary()
        if np.asarray(tokens).ndim != 1:
            raise EngineValueError("draft tokens must be a one-dimensional array.")
        if not self._core.speculate:
            raise EngineError("This engine does not support speculative draft verification.")
        if s.state == _Session.CLOSED:
            raise EngineError("Cannot propose drafts for a closed request.")
        drafts = self._token_array(tokens) if len(tokens) else np.zeros(0, np.int64)
        if drafts.size > self._core.speculate:
            raise EngineValueError(
                f"{drafts.size} draft tokens: at most {self._core.speculate} per proposal "
                "(max_draft_tokens_per_proposal)"
            )
        self._core.offer(s.row, drafts)

    def close(self, s: _Session) -> None:
        self._check_owner()
        self._close(s)

    # -- internals -------------------------------------------------------------------------------

    def _check_owner(self) -> None:
        if threading.get_ident() != self._owner:
            raise EngineError("Engine operations must be called from the Engine owner thread.")

    def _boundary(self) -> None:
        """Owner-thread check, then close the Requests whose last handle was dropped."""
        self._check_owner()
        while self.abandoned:
            self._close(self.abandoned.pop())

    def _close(self, s: _Session) -> None:
        if s.state == _Session.CLOSED:
            return
        handle = s.handle()  # None once abandoned: its events lost their request too
        if self._events:
            self._events = deque(e for e in self._events if e.request is not handle)
        if s.state == _Session.QUEUED:
            self._queue.remove(s)
        s.state = _Session.CLOSED
        s.turn = None
        s.row.logits = None
        if s not in self._batch:  # a batch keeps its closed rows until it dissolves
            self._evict(s)

    def _token_array(self, tokens: Any) -> np.ndarray:
        try:
            ids = np.asarray(tokens)
        except (ValueError, TypeError) as exc:  # ragged lists, objects numpy cannot hold
            raise EngineValueError(
                f"tokens must be a one-dimensional array of ids: {exc}"
            ) from None
        if ids.ndim != 1:
            raise EngineValueError("tokens must be a one-dimensional array.")
        if ids.size == 0:
            raise EngineError("Expected at least one input token for generation. Received 0.")
        if ids.dtype.kind not in "iu":
            raise EngineTypeError(f"tokens must be integers, got {ids.dtype}")
        bad = (ids < 0) | (ids >= self._vocab)
        if bad.any():
            raise EngineValueError(
                f"token {int(ids[bad][0])} is out of the vocabulary (0..{self._vocab - 1})"
            )
        return ids.astype(np.int64)

    def _picker(self, policy: TurnPolicy) -> TokenPicker:
        picker = self._core.picker(policy.generation, guidance=policy.guidance)
        if policy.min_generated_tokens:
            floor = MinNewTokens(
                policy.min_generated_tokens, sorted(self._core.eos), vocab_size=self._vocab
            )
            picker = TokenPicker((floor, *picker.ops), picker.terminal, reference_order=True)
        return picker

    def _evict(self, s: _Session) -> None:
        """``s`` gives up its slot; its tokens stay, to be run again on its next turn."""
        if s.row.slot >= 0:
            self._holders[s.row.slot] = None
        s.row.slot = -1
        s.row.processed = 0
        s.prefilled = 0
        s.row.logits = None

    def _form_batch(self) -> None:
        """The next batch: up to MAX_BATCH queued sessions, in the order their turns began."""
        members: list[_Session] = []
        while self._queue and len(members) < MAX_BATCH:
            members.append(self._queue.popleft())
        for old in self._batch:
            if old.state == _Session.CLOSED:
                self._evict(old)
        self._batch = members
        for s in members:
            s.state = _Session.ACTIVE
        for s in members:
            if s.row.slot < 0:
                self._core.place(s.row, self._free_slot(members))
                self._holders[s.row.slot] = s
                self._from_cache(s)

    def _from_cache(self, s: _Session) -> None:
        """Copy the rows of the longest cached prefix of the session's tokens into its slot
        (just placed, holding none), leaving at least two tokens to prefill."""
        cache, row = self._prompt_cache, s.row
        if cache is None:
            return
        tokens = row.history.array()
        lease = cache.lookup(tokens, len(tokens) - 2)
        try:
            if lease.length > row.processed:
                self._core.slots.write_rows(row.slot, 0, lease.rows(0, lease.length))
                row.processed = s.prefilled = lease.length
                s.turn.cached = max(0, lease.length - s.turn_starts[s.turn.id])
        except Exception:  # the cache is an optimisation: the tokens are prefilled instead
            log.exception("prompt cache: rows could not be copied into slot %d", row.slot)
            self._core.slots.rewind(row.slot, 0)
            row.processed = s.prefilled = 0
        finally:
            cache.release(lease)

    def _offer(self, s: _Session) -> None:
        """Give the prompt cache the rows the session's prefills computed."""
        slot = s.row.slot
        try:
            tokens = s.row.history.array()[: s.prefilled]
            self._prompt_cache.offer(tokens, lambda a, b: self._core.slots.read_rows(slot, a, b))
        except Exception:
            log.exception("prompt cache: a prompt's rows could not be kept")

    def _free_slot(self, keep: list[_Session]) -> int:
        """A free slot, or that of the least recently used session outside ``keep``."""
        if None in self._holders:
            return self._holders.index(None)
        idle = [h for h in self._holders if h is not None and h not in keep]
        victim = min(idle, key=lambda h: h.last_used)
        slot = victim.row.slot
        self._evict(victim)
        return slot

    def _step(self) -> None:
        if not any(s.state == _Session.ACTIVE for s in self._batch):
            if not self._queue:
                return
            self._form_batch()
        running = [s for s in self._batch if s.state == _Session.ACTIVE]
        slots = [s.row.slot for s in self._batch if s.row.slot >= 0]
        span = range(min(slots), max(slots) + 1)
        self._clock += 1
        # rows that prefill on top of prefilled rows only: theirs stay a prefill's
        prefilling = [s for s in running if s.row.pending > 1 and s.row.processed == s.prefilled]
        try:
            self._core.advance([s.row for s in running], span)
        except Exception:  # every running turn reports the failure; the engine goes on
            log.exception("an engine step failed")
            for s in running:
                self._evict(s)
                self._finish(s, FinishReason.FAILED, code=EngineErrorCode.ENGINE_EXECUTION_FAILURE)
            return
        self._passes += 1
        for s in prefilling:
            s.prefilled = s.row.processed
            if self._prompt_cache is not None:
                self._offer(s)
        for s in running:
            s.last_used = self._clock
            try:
                self._choose(s)
            except Exception:  # this request's token choice failed, not the others'
                log.exception("choosing a token failed")
                s.row.logits = None
                self._finish(s, FinishReason.FAILED, code=EngineErrorCode.REQUEST_UNSERVICEABLE)

    def _choose(self, s: _Session) -> None:
        """The turn's next token, and those after it while a verify pass scored them."""
        try:
            while self._choose_one(s) and self._core.follow(s.row):
                pass
        finally:
            self._core.settle(s.row)

    def _choose_one(self, s: _Session) -> bool:
        """One token for the turn; False when the turn ended."""
        turn, row = s.turn, s.row
        # The policy lets a finished grammar's turn go on to the EOS it forces, as the
        # reference reports it: that EOS is taken as chosen, without a choice.
        if turn.grammar_done:
            row.logits = None
            self._finish(s, FinishReason.EOS)
            return False
        token, turn.grammar_done, _ = self._core.choose(row)
        matched: list[int] = []
        reason = self._core.stop_after(
            row, token, generated=turn.generated + 1, budget=turn.policy.max_generated_tokens,
            context=s.max_session, complete=turn.grammar_done,
            stop_string=lambda: self._stop_string(turn, token, matched),
        )  # fmt: skip
        if reason is not None:  # a verify round cut short counts its drafts in the usage
            self._core.settle(row)
        if reason is StopReason.EOS:  # never part of the request's tokens (the policy)
            self._finish(s, FinishReason.EOS)
            return False
        turn.generated += 1
        handle = s.handle()
        if reason is None:
            self._events.append(EngineEvent(TOKEN, handle, turn.id, token))
            return True
        s.state = _Session.COMPLETE
        index = matched[0] if matched else None
        event = EngineEvent(
            TOKEN | FINISHED, handle, turn.id, token, _FINISH[reason], index, usage=turn.usage()
        )
        self._events.append(event)
        return False

    def _stop_string(self, turn: _Turn, token: int, matched: list[int]) -> bool:
        """Feed the token's text to the turn's matcher; a completed stop string's index goes
        into ``matched``."""
        if turn.stops is None:
            return False
        stream, matcher = turn.stops
        match = matcher.feed(stream.decode(token))
        if match is not None:
            matched.append(match.index)
        return match is not None

    def _finish(
        self,
        s: _Session,
        reason: FinishReason,
        *,
        merge: bool = False,
        code: EngineErrorCode = EngineErrorCode.NONE,
    ) -> None:
        """End the current turn with ``reason`` and report it: on the turn's undelivered last
        token event when ``merge`` (a cancel), else as an event of its own."""
        turn, handle = s.turn, s.handle()
        s.state = _Session.COMPLETE
        if merge:
            at = next(
                (
                    i
                    for i in range(len(self._events) - 1, -1, -1)
                    if self._events[i].request is handle
                ),
                -1,
            )
            last = self._events[at] if at >= 0 else None
            if last is not None and last.turn_id == turn.id and last.flags == TOKEN:
                self._events[at] = EngineEvent(
                    TOKEN | FINISHED, handle, turn.id, last.token, reason, usage=turn.usage()
                )
                return
        flags = FINISHED if code == EngineErrorCode.NONE else FINISHED | FAILED
        self._events.append(
            EngineEvent(flags, handle, turn.id, None, reason, None, code, turn.usage())
        )


def is_turn_id(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0
