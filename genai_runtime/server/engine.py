"""The server's engine: one thread owns the model; requests wait in a bounded queue, then decode
together.

Each step the engine admits waiting requests into free slots (prefilling their prompts, reusing
a slot's cached prefix when the prompt starts with it, or a longer one from the prompt cache
that every request shares: ``batching.prompt_cache``), then advances every active request by
one token: all rows in one onnxruntime call with ``BatchedSlots``, one after another with
``InterleavedSlots`` (the model work and the token choice are ``batching.core.DecodeCore``'s,
shared with the 0.18 Engine API). A request cancelled by its client (or past its deadline) is
dropped at the next step and its slot freed. Events go back to the asyncio side with
``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..adapters import Adapters
from ..batching.core import DecodeCore, Row, TokenHistory, context_that_fits
from ..batching.prompt_cache import BLOCK_TOKENS, DEFAULT_MEMORY_MB, Lease
from ..batching.prompt_files import DEFAULT_DISK_MB, open_prompt_cache
from ..batching.settings import RequestSettings
from ..batching.stops import StopMatcher, pending_stop_prefix
from ..decoding.picker import TokenPicker
from ..decoding.processors import Processor
from ..decoding.sampling import make_rng
from ..decoding.stopping import StopReason
from ..model import Model
from ..tokenizer import Tokenizer
from .protocol import APIError

log = logging.getLogger("genai_runtime.server")


@dataclass(eq=False)  # identity: jobs are found in the queue by ``is``, never compared
class Job:
    """One request as the engine sees it. ``events`` receives tuples: ``("delta", text,
    [logprob entries])``, ``("done", finish_reason, usage)`` or ``("error", APIError)``.
    """

    prompt: np.ndarray
    sampling: RequestSettings
    max_tokens: int
    deadline: float
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    picker: TokenPicker
    adapter: str | None = None  # a LoRA adapter of the engine's, by name
    cancelled: bool = False
    submitted: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    # engine-side state
    row: Row | None = None  # prompt + generated tokens, slot, logits (set on admission)
    generated: int = 0
    text: str = ""
    sent: int = 0  # characters of ``text`` already sent
    reused: int = 0  # prompt tokens taken from a slot's cache or the prompt cache
    lease: Lease | None = None  # the prompt cache's blocks it started from
    stream: Any = None
    stops: StopMatcher | None = None

    @property
    def slot(self) -> int:
        return -1 if self.row is None else self.row.slot

    def emit(self, *event: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the server's loop is closed (shutting down): nobody listens
            self.cancelled = True


@dataclass
class Stats:
    requests: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reused_tokens: int = 0
    ttft_sum: float = 0.0
    ttft_count: int = 0
    steps: int = 0


class ServerEngine:
    def __init__(
        self,
        model: Model,
        tokenizer: Tokenizer,
        *,
        max_active: int = 4,
        max_queued: int = 16,
        max_context: int | None = None,
        batched: bool | None = None,
        prefix_reuse: bool = True,
        adapters: Adapters | None = None,
        prompt_cache_mb: int = DEFAULT_MEMORY_MB,
        prompt_cache_dir: str | None = None,
        prompt_cache_disk_mb: int = DEFAULT_DISK_MB,
        prompt_cache_block: int = BLOCK_TOKENS,
        speculate: int = 0,
        draft: Model | None = None,
    ):
        """``prompt_cache_mb``: the prompt cache's memory budget (0: no prompt cache);
        ``prompt_cache_dir``: where it is kept across restarts, within ``prompt_cache_disk_mb``;
        ``prompt_cache_block``: tokens per cached block; ``speculate``: the most prompt-lookup
        drafts each row verifies per pass (0: none, ``batching.speculation``); ``draft``: a
        smaller model of the same vocabulary whose tokens are the drafts instead."""
        self.model = model
        self.adapters = adapters
        self.prefix_reuse = prefix_reuse
        self.tokenizer = tokenizer
        self.max_queued = max_queued
        if max_context is None:
            self.context, self.context_source = context_that_fits(model, max_active)
        else:
            self.context = min(model.spec.generation.max_length, max_context)
            self.context_source = "--max-context"
        self.core = DecodeCore(
            model, num_slots=max_active, context=self.context, batched=batched,
            adapters=adapters, speculate=speculate, draft=draft,
        )  # fmt: skip
        self.slots = self.core.slots
        self.prompt_cache, self.prompt_cache_note = open_prompt_cache(
            model, self.slots, mb=prompt_cache_mb, folder=prompt_cache_dir,
            disk_mb=prompt_cache_disk_mb, block=prompt_cache_block, max_tokens=self.context,
        )  # fmt: skip
        self.stats = Stats()
        self.failed: str | None = None  # set if the engine thread dies
        self._waiting: deque[Job] = deque()
        # work that needs the model to itself (an embedding): run between decode steps
        self._calls: deque[tuple[Callable[[], Any], asyncio.AbstractEventLoop, asyncio.Future]]
        self._calls = deque()
        self._active: dict[int, Job] = {}
        self._held: list[np.ndarray] = [np.zeros(0, np.int64)] * max_active  # per slot
        self._held_adapter: list[str | None] = [None] * max_active  # what computed _held
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="genai-engine", daemon=True)

    # -- called from the server (any thread) --------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        self._thread.join(timeout=10)
        if self.prompt_cache is not None:
            self.prompt_cache.close()  # queued disk writes finish first

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.failed is None

    def counts(self) -> tuple[int, int]:
        """(active, waiting) requests."""
        with self._lock:
            return len(self._active), len(self._waiting)

    def submit(self, job: Job) -> None:
        """Queue a job, or raise APIError 429 if the queue is full / 503 if the engine died."""
        if not self.alive:
            raise APIError(
                503, f"the engine is not running: {self.failed}", type="server_error",
                code="engine_unavailable",
            )  # fmt: skip
        with self._wake:
            if len(self._waiting) >= self.max_queued:
                raise APIError(
                    429,
                    f"the server is busy: {self.max_queued} requests are already waiting",
                    type="rate_limit_error",
                    code="queue_full",
                    headers={"Retry-After": "1"},
                )
            self._waiting.append(job)
            self._wake.notify()

    def between_steps(self, fn: Callable[[], Any]) -> asyncio.Future:
        """Run ``fn()`` on the engine thread, between two decode steps (it has the model to
        itself there); await the returned future for its result or exception. Bounded like the
        queue: 429 when ``max_queued`` calls already wait."""
        if not self.alive:
            raise APIError(503, f"the engine is not running: {self.failed}", type="server_error",
                           code="engine_unavailable")  # fmt: skip
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._wake:
            if len(self._calls) >= self.max_queued:
                raise APIError(
                    429, f"the server is busy: {self.max_queued} calls are already waiting",
                    type="rate_limit_error", code="queue_full", headers={"Retry-After": "1"},
                )  # fmt: skip
            self._calls.append((fn, loop, future))
            self._wake.notify()
        return future

    def picker(self, sampling: RequestSettings, grammar: Processor | None = None) -> TokenPicker:
        """The token picker for one request: its sampling settings and optional grammar (a
        ``response_format``), through the same chain a Generator uses."""
        ops = sampling.ops(self.core.vocab_size or 0)
        return self.core.picker(sampling.generation(), grammar=grammar, request_ops=ops)

    def prompt_cache_metrics(self) -> list[tuple[str, str, int]]:
        """The prompt cache's counters and gauges for ``/metrics`` (none when it is off).
        Read without a lock: each value is one int, possibly a step old."""
        cache = self.prompt_cache
        if cache is None:
            return []
        s = cache.stats
        out = [
            ("genai_prompt_cache_bytes", "gauge", cache.used),
            ("genai_prompt_cache_budget_bytes", "gauge", cache.budget),
            ("genai_prompt_cache_blocks", "gauge", len(cache)),
            ("genai_prompt_cache_lookups_total", "counter", s.lookups),
            ("genai_prompt_cache_hits_total", "counter", s.hits),
            ("genai_prompt_cache_hit_tokens_total", "counter", s.hit_tokens),
            ("genai_prompt_cache_evicted_blocks_total", "counter", s.evicted_blocks),
            ("genai_prompt_cache_refused_blocks_total", "counter", s.refused_blocks),
            ("genai_prompt_cache_loaded_blocks_total", "counter", s.loaded_blocks),
        ]
        files = cache.files
        if files is not None:
            f = files.stats
            out += [
                ("genai_prompt_cache_files_written_total", "counter", f.written),
                ("genai_prompt_cache_files_loaded_total", "counter", f.loaded),
                ("genai_prompt_cache_files_dropped_total", "counter", f.dropped),
                ("genai_prompt_cache_files_removed_total", "counter", f.removed),
            ]
        return out

    def speculation_metrics(self) -> list[tuple[str, str, float]]:
        """Speculation's counters for ``/metrics`` (none when it is off)."""
        if not self.core.speculate:
            return []
        s = self.core.speculation
        return [
            ("genai_speculative_passes_total", "counter", s.passes),
            ("genai_speculative_plain_steps_total", "counter", s.plain_steps),
            ("genai_speculative_draft_tokens_total", "counter", s.proposed),
            ("genai_speculative_accepted_tokens_total", "counter", s.accepted),
            ("genai_speculative_probes_total", "counter", s.probes),
        ]

    def cancel(self, job: Job) -> None:
        job.cancelled = True
        with self._wake:
            self._wake.notify()

    # -- the engine thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._wake:
                    while not (self._stop or self._waiting or self._active or self._calls):
                        self._wake.wait()
                    if self._stop:
                        break
                if self._calls:  # (a decode step takes no lock for none)
                    self._run_calls()
                self._step()
        except BaseException as exc:  # keep serving 503s rather than hang every request
            self.failed = f"{type(exc).__name__}: {exc}"
            log.exception("engine thread failed")
            with self._lock:
                jobs = [*self._active.values(), *self._waiting]
                calls = list(self._calls)
                self._active.clear()
                self._waiting.clear()
                self._calls.clear()
            for job in jobs:
                job.emit("error", APIError(503, "the engine failed", type="server_error"))
            for _, loop, future in calls:
                failed = APIError(503, "the engine failed", type="server_error")
                _settle(loop, future, False, failed)

    def _run_calls(self) -> None:
        """The calls waiting now, in order: one per decode step while requests decode (each
        call stalls every reply by its time), else all of them."""
        with self._lock:
            count = 1 if self._active or self._waiting else len(self._calls)
            calls = [self._calls.popleft() for _ in range(min(count, len(self._calls)))]
        for fn, loop, future in calls:
            if future.cancelled():  # its client went away
                continue
            try:
                _settle(loop, future, True, fn())
            except Exception as exc:  # the caller's to answer (a bad input is not our failure)
                _settle(loop, future, False, exc)

    def _step(self) -> None:
        now = time.monotonic()
        self._drop_finished(now)
        self._admit(now)
        waiting = [j.row for j in self._active.values() if j.row.logits is None]
        if waiting:
            self.core.advance(waiting)
            self.stats.steps += 1
        for job in list(self._active.values()):
            if job.row.logits is not None and not job.cancelled:
                try:
                    self._choose(job)
                except Exception as exc:  # one request's bad sampling must not stop the rest
                    self._finish(job, None)
                    self._count("error")
                    job.emit("error", APIError(400, f"token selection failed: {exc}"))

    def _drop_finished(self, now: float) -> None:
        with self._lock:
            for job in [j for j in self._waiting if j.cancelled]:
                self._waiting.remove(job)
                self._count("cancelled")
            for job in [j for j in self._waiting if now > j.deadline]:
                self._waiting.remove(job)
                self._timeout(job)
        for job in list(self._active.values()):
            if job.cancelled:
                self._finish(job, None)
                self._count("cancelled")
            elif now > job.deadline:
                self._finish(job, None)
                self._timeout(job)

    def _timeout(self, job: Job) -> None:
        self._count("timeout")
        job.emit(
            "error",
            APIError(408, "the request timed out", type="timeout_error", code="timeout"),
        )

    def _admit(self, now: float) -> None:
        while True:
            with self._lock:
                free = [s for s in range(self.slots.num_slots) if s not in self._active]
                if not free or not self._waiting:
                    return
                job = self._waiting.popleft()
            slot, common = self._pick_slot(free, job.prompt, job.adapter)
            common = self._from_cache(job, slot, common)
            job.reused = common
            rng = make_rng(-1 if job.sampling.seed is None else job.sampling.seed % 2**63)
            job.row = Row(
                TokenHistory(job.prompt), job.picker, rng, adapter=job.adapter, processed=common,
                limit=len(job.prompt) + job.max_tokens,
            )  # fmt: skip
            self.core.place(job.row, slot)
            job.stream = self.tokenizer.create_stream()
            job.stops = StopMatcher(job.sampling.stop)
            with self._lock:
                self._active[slot] = job
            self._held[slot] = job.prompt[:common]
            self._held_adapter[slot] = job.adapter
            try:
                self.core.advance([job.row])
            except Exception as exc:
                self._finish(job, None)
                self._held[slot] = np.zeros(0, np.int64)
                self._count("error")
                job.emit("error", APIError(400, f"the prompt could not be run: {exc}"))
                continue
            self.stats.prompt_tokens += len(job.prompt)
            self.stats.reused_tokens += common
            self._offer(job, slot)

    def _reuses(self, job: Job) -> bool:
        return self.prompt_cache is not None and self.prefix_reuse and job.adapter is None

    def _from_cache(self, job: Job, slot: int, common: int) -> int:
        """How many prompt tokens the slot holds once the prompt cache's longest prefix (if
        longer than ``common``, what the slot holds already) is copied in. At least two
        tokens are left to prefill, as ``_pick_slot`` leaves them."""
        if not self._reuses(job):
            return common
        cache = self.prompt_cache
        job.lease = lease = cache.lookup(job.prompt, len(job.prompt) - 2)
        if lease.length <= common:
            return common
        try:
            self.slots.write_rows(slot, common, lease.rows(common, lease.length))
        except Exception:  # the cache is an optimisation: the prompt is prefilled instead
            log.exception("prompt cache: rows could not be copied into slot %d", slot)
            return 0
        return lease.length

    def _offer(self, job: Job, slot: int) -> None:
        """Give the prompt cache the rows of a prompt just prefilled."""
        if not self._reuses(job):
            return
        try:
            self.prompt_cache.offer(job.prompt, lambda a, b: self.slots.read_rows(slot, a, b))
        except Exception:
            log.exception("prompt cache: a prompt's rows could not be kept")

    def _pick_slot(
        self, free: list[int], prompt: np.ndarray, adapter: str | None = None
    ) -> tuple[int, int]:
        """The free slot sharing the longest prefix with ``prompt`` (cached under the same
        adapter). At least two tokens are always prefilled: int4 kernels round a one-row pass
        differently, and the logits must not depend on how much of the prompt was cached."""
        best, best_common = free[0], -1
        if not self.prefix_reuse:
            return best, 0
        for slot in free:
            if self._held_adapter[slot] != adapter:
                continue
            held = self._held[slot]
            n = max(0, min(len(held), len(prompt) - 2))
            differ = np.flatnonzero(held[:n] != prompt[:n])
            common = int(differ[0]) if differ.size else n
            if common > best_common:
                best, best_common = slot, common
        return best, max(best_common, 0)

    def _choose(self, job: Job) -> None:
        """The job's next token, and those after it while a verify pass scored them (its
        drafts matched)."""
        while self._choose_one(job) and self.core.follow(job.row):
            pass

    def _choose_one(self, job: Job) -> bool:
        """One token for the job; False when the reply ended with it."""
        s = job.sampling
        # with logprobs, the reply reports the model's own distribution, never a grammar's mask
        token, complete, logits = self.core.choose(job.row, keep_logits=s.logprobs)
        if job.first_token_at is None:
            job.first_token_at = time.monotonic()
            self.stats.ttft_sum += job.first_token_at - job.submitted
            self.stats.ttft_count += 1
        job.generated += 1
        self.stats.completion_tokens += 1
        reason = self.core.stop_after(
            job.row, token, generated=job.generated, budget=job.max_tokens,
            context=self.context, complete=complete, stop_string=lambda: self._add_text(job, token),
        )  # fmt: skip
        entries = []
        if s.logprobs and reason is not StopReason.EOS:
            entries.append(self._logprob(job, logits, token))
        if reason is not None:
            self._flush(job, job.text, entries)
            self._done(job, reason.openai)
            return False
        # Hold back a tail that could still grow into a stop string.
        hold = pending_stop_prefix(job.text, s.stop)
        self._flush(job, job.text[: len(job.text) - hold], entries)
        return True

    def _add_text(self, job: Job, token: int) -> bool:
        """Add the token's text to the reply; True when it completes a stop string (the reply
        is then cut where the stop string starts)."""
        piece = job.stream.decode(token)
        match = job.stops.feed(piece)
        job.text += piece
        if match is not None:
            job.text = job.text[: match.start]
        return match is not None

    def _flush(self, job: Job, upto: str, entries: list) -> None:
        if len(upto) > job.sent or entries:
            job.emit("delta", upto[job.sent :], entries)
            job.sent = max(job.sent, len(upto))

    def _done(self, job: Job, reason: str) -> None:
        self.core.settle(job.row)  # a round cut short by the stop counts its drafts first
        usage = {
            "prompt_tokens": len(job.prompt),
            "completion_tokens": job.generated,
            "total_tokens": len(job.prompt) + job.generated,
            "prompt_tokens_details": {"cached_tokens": job.reused},
        }
        row = job.row
        if self.core.speculate:  # OpenAI's names for drafted tokens kept and thrown away
            usage["completion_tokens_details"] = {
                "accepted_prediction_tokens": row.accepted,
                "rejected_prediction_tokens": row.drafted - row.accepted,
            }
        self._finish(job, reason)
        self._count("ok")
        job.emit("done", reason, usage)

    def _finish(self, job: Job, reason: str | None) -> None:
        with self._lock:
            if self._active.get(job.slot) is job:
                del self._active[job.slot]
        # Only the prompt counts as reusable: generated tokens were written by batched one-token
        # passes, which int4 kernels round differently from a prefill, so reusing them would
        # make a follow-up turn's greedy text differ from a fresh server's (6/20 conversations,
        # benchmarks/server_prefix_parity.py). A follow-up prefills the reply again instead.
        self._held[job.slot] = job.prompt
        if job.row is not None:
            self.core.settle(job.row)
        self.slots.release(job.slot)
        if job.lease is not None:
            self.prompt_cache.release(job.lease)
            job.lease = None

    def _count(self, outcome: str) -> None:
        self.stats.requests[outcome] = self.stats.requests.get(outcome, 0) + 1

    def _logprob(self, job: Job, logits: np.ndarray, token: int) -> dict[str, Any]:
        row = logits.astype(np.float64)
        row = row - row.max()
        logp = row - np.log(np.exp(row).sum())
        entry = {"id": token, "logprob": float(logp[token]), "top": []}
        k = job.sampling.top_logprobs
        if k:
            top = np.argpartition(-logp, k)[:k]
            top = top[np.argsort(-logp[top], kind="stable")]
            entry["top"] = [(int(t), float(logp[t])) for t in top]
        return entry


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future, ok: bool, value: Any) -> None:
    """Give ``future`` its result (``ok``) or exception, on its own loop."""

    def settle() -> None:
        if future.done():
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    # A closed loop (the server shutting down) has nobody listening.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(settle)
