"""``GeneratorParams`` and ``Generator``: onnxruntime-genai's generation loop over our executor.

Timing follows the reference: ``append_tokens`` runs the prompt at once; the forward pass for a
sampled token runs at the start of the next ``generate_next_token``. Divergences (documented in
docs/design/decisions.md): a token generated but not yet run is fed along with tokens appended
after it, and ``rewind_to(n)`` keeps exactly ``n`` tokens and recomputes the logits after the
n-th.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from typing import Any

import numpy as np

from .adapters import Adapters
from .checks import is_number
from .decoding.beam import BeamScorer, check_beam_search
from .decoding.chain import make_picker
from .decoding.sampling import make_rng
from .decoding.stopping import StopRule
from .environment import LOG, log
from .errors import GenaiRuntimeError, GenerationError, ModelError, UnsupportedError
from .model import Model
from .runtime.adapters import bind_adapter
from .runtime.driver import DecodeState, DriverSetup
from .runtime.plan import logits_problem
from .runtime.run_control import TERMINATE, apply_runtime_option, runtime_option
from .spec import SEARCH_OPTIONS, GenerationSpec, SearchOption
from .validation import as_array, as_index, as_name, serialized, shown, unlocked

ON_DEVICE = object()  # a pass's logits left where its session wrote them (``_host_logits``)


class GeneratorParams:
    def __init__(self, model: Model):
        if not isinstance(model, Model):
            raise GenerationError(f"GeneratorParams(model): expected a Model, got {shown(model)}")
        self.model = model
        self.search: GenerationSpec = model.spec.generation
        self.guidance: tuple[str, str] | None = None
        # what a guidance error names: the call here, a flag on the command line
        self.guidance_source = "set_guidance"

    def set_guidance(self, type: str, data: str, enable_ff_tokens: bool = False) -> None:
        """Constrain generation to a ``json_schema``, ``regex`` or ``lark_grammar`` (llguidance).

        Checked when the Generator is built. ``enable_ff_tokens`` is accepted for compatibility;
        forced tokens are still produced one step at a time.
        """
        if not isinstance(type, str) or not isinstance(data, str):
            raise GenerationError("set_guidance expects two strings: type and data")
        self.guidance = (type, data) if type or data else None

    def set_search_options(self, **options: Any) -> None:
        values = {}
        for key, value in options.items():
            option = SEARCH_OPTIONS.get(key)
            if option is None:
                raise GenerationError(
                    f"unknown search option {key!r} (expected one of: {', '.join(SEARCH_OPTIONS)})"
                )
            values[key] = _coerce(option, value)
        self.search = dataclasses.replace(self.search, **values)

    def get_search_options(self) -> dict[str, Any]:
        """As the reference returns them: numbers as floats, flags as bools."""
        out = {}
        for key, option in SEARCH_OPTIONS.items():
            value = getattr(self.search, key)
            out[key] = value if option.kind is bool else float(value)
        return out

    def try_graph_capture_with_max_batch_size(self, max_batch_size: int) -> None:
        """Accepted for compatibility (deprecated in the reference); CPU has no graph capture."""


def _coerce(option: SearchOption, value: Any) -> Any:
    key, kind = option.name, option.kind
    if kind is bool:
        if isinstance(value, (bool, np.bool_)) or value in (0, 1):
            return bool(value)
        raise GenerationError(f"search option {key}: expected a bool, got {shown(value)}")
    if not is_number(value):
        raise GenerationError(f"search option {key}: expected a number, got {shown(value)}")
    if not math.isfinite(value):
        raise GenerationError(f"search option {key}: expected a finite number, got {value!r}")
    if kind is int:
        if float(value) != int(value):
            raise GenerationError(f"search option {key}: expected an integer, got {value!r}")
        value = int(value)
        if not -(2**31) <= value < 2**31:  # the reference's int32 fields
            raise GenerationError(f"search option {key}: {value} does not fit in an int32")
    else:
        value = float(value)
    low, high = option.low, option.high
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise GenerationError(f"search option {key}: expected a value {bounds}, got {value!r}")
    return value


@serialized  # one lock per generator: calls from several threads take turns
class Generator:
    def __init__(self, model: Model, params: GeneratorParams):
        if not isinstance(model, Model):
            raise GenerationError(f"Generator(model, params): expected a Model, got {shown(model)}")
        if not isinstance(params, GeneratorParams):
            raise GenerationError(
                f"Generator(model, params): expected GeneratorParams, got {shown(params)}"
            )
        search = params.search
        spec = model.spec
        if search.max_length <= 0:
            raise GenerationError("max_length is not set (generation.max_length / search)")
        if all(stage.logits is None for stage in model.plan.stages):
            raise logits_problem(spec, model.ios) or ModelError("no stage outputs logits")
        context = spec.model.context_length
        if context and search.max_length > context:  # the reference's check and wording
            raise GenerationError(
                f"max_length ({search.max_length}) cannot be greater than model context_length "
                f"({context})"
            )
        vocab = model.vocab_size
        if vocab is None:
            raise ModelError("the logits' vocabulary size is neither in the graph nor the config")
        self.model = model
        self.search = search
        self.batch_size = search.batch_size
        self._rows = search.batch_size * search.num_beams  # the executor's batch
        self.max_length = search.max_length
        self.vocab_size = vocab
        self.pad_token_id = spec.tokens.pad if spec.tokens.pad is not None else 0
        self.eos_token_ids = np.array(spec.tokens.eos, dtype=np.int64)
        self._stop = StopRule(spec.tokens.eos, vocab)
        pipeline = model.pipeline
        self.kv_plan = pipeline.kv_plan(search.past_present_share_buffer)
        # Built first: a bad chain or grammar fails before the executor allocates its buffers.
        self._picker = make_picker(
            search, eos_token_ids=spec.tokens.eos, vocab_size=vocab, batch_size=self.batch_size,
            guidance=params.guidance, guidance_source=params.guidance_source,
            tokenizer_json=None if spec.model_dir is None else spec.model_dir / "tokenizer.json",
        )  # fmt: skip
        check_beam_search(
            search, greedy=self._picker.is_greedy, grammar=self._picker.grammar is not None,
            vocab_size=vocab,
        )  # fmt: skip
        self._exec = pipeline.executor(
            self._rows, self.max_length, share_buffer=search.past_present_share_buffer
        )
        self._rng = make_rng(search.random_seed)
        try:
            self._seq = np.zeros((self._rows, self.max_length), np.int32)
        except MemoryError:
            raise GenerationError(
                f"cannot allocate a {self._rows} x {self.max_length} token sequence "
                "(batch_size x num_beams x max_length)"
            ) from None
        self._length = 0
        # Logits awaiting a token choice: a host array, or ON_DEVICE (still where the session
        # wrote them: ``_host_logits`` copies them out, greedy choice takes only the ids).
        self._logits: np.ndarray | object | None = None
        self._pending: np.ndarray | None = None  # tokens in the sequence, not yet run
        self._next = np.zeros(self._rows, np.int32)
        self._eos_seen = np.zeros(self._rows, bool)
        self._any_eos = False
        self._done = False
        self._terminated = False  # set_runtime_option("terminate_session", "1")
        # LoRA adapters turned on (set_active_adapter): their container, names, tensor owners.
        self._adapters: Adapters | None = None
        self._adapter_of: dict[str, str] = {}  # tensor name -> the active adapter setting it
        # Speculative decoding or a controller plugin: tokens come in rounds, handed out singly.
        self._driver = None
        self._queue: deque[int] = deque()  # a round's tokens not handed out yet
        # Beam search: the scorer keeps the hypotheses, the generator the rows (see _beam_step).
        self._beams: BeamScorer | None = None
        self._beam_results: list[list[tuple[float, np.ndarray]]] | None = None
        if search.num_beams > 1:
            self._beams = BeamScorer(
                self.batch_size, search.num_beams, length_penalty=search.length_penalty,
                early_stopping=search.early_stopping, eos_token_ids=spec.tokens.eos,
                pad_token_id=self.pad_token_id,
            )  # fmt: skip
        if model.driver_factory is not None:
            if self._rows != 1:
                raise UnsupportedError(
                    f"{model.driver_kind} decodes one sequence at a time; batch_size is "
                    f"{self.batch_size}, num_beams {search.num_beams}"
                )
            self._driver = model.driver_factory(
                DriverSetup(self._exec, self._picker, self._rng, self.batch_size,
                            self.max_length, vocab)
            )  # fmt: skip

    # -- the reference API -----------------------------------------------------------------

    def append_tokens(self, tokens: Any) -> None:
        self._live()
        self._sync()
        new = self._as_batch(tokens)
        if self._beams is not None:
            if self._length:
                raise UnsupportedError(
                    "with num_beams > 1, append_tokens takes the prompt once; a beam search "
                    "cannot be continued"
                )
            new = np.repeat(new, self.search.num_beams, axis=0)  # every beam starts there
        n = new.shape[1]
        if self._length + n > self.max_length:
            raise GenerationError(
                f"{n} tokens + current length {self._length} exceed max_length {self.max_length}"
            )
        if self._length and self.batch_size > 1:
            raise GenerationError(
                "append_tokens can be called once per batch (batch_size > 1); rewind_to(0) first"
            )
        feed = new if self._pending is None else np.concatenate([self._pending, new], axis=1)
        self._logits = self._forward(feed)
        self._seq[:, self._length : self._length + n] = new
        self._length += n
        self._picker.start(self._length)
        self._pending = None
        self._eos_seen[:] = False
        self._any_eos = False
        self._done = False

    def generate_next_token(self) -> None:
        self._live()
        if self._done and self._logits is None and self._length < self.max_length:
            # Every row has ended: as the reference, run nothing and report pad as next tokens.
            self._next[:] = self.pad_token_id
            return
        if self._length == 0 and self._logits is None:
            raise GenerationError("generate_next_token before append_tokens: no tokens to extend")
        if self._length >= self.max_length:
            raise GenerationError(
                f"sequence is already at max_length ({self.max_length}); nothing to generate"
            )
        if self._logits is None and self._any_eos and self._eos_seen.all():
            self._next[:] = self.pad_token_id  # every row has ended: pad, as the reference does
            return
        if self._driver is not None:
            return self._next_from_driver()
        if self._logits is None and self._pending is None:
            raise GenerationError("no logits: append_kv gives none; call append_tokens next")
        if self._logits is None:
            self._logits = self._forward(self._pending)
            self._pending = None
        if self._beams is not None:
            return self._beam_step()
        top_k = self._picker.device_top_k if self._logits is ON_DEVICE else None
        if self._logits is ON_DEVICE and self._picker.argmax_only:
            tokens = self._exec.argmax()
        elif top_k is not None and top_k < self.vocab_size:
            values, ids = self._exec.top_k(top_k)
            tokens = self._picker.pick_top_k(values, ids, self._rng)
        else:
            tokens = self._picker.pick(self._seq[:, : self._length], self._host_logits(), self._rng)
        if self._any_eos:
            tokens[self._eos_seen] = self.pad_token_id
        # A finished grammar ends its row like EOS, but its last token is content, not EOS.
        complete = self._picker.commit(tokens, self._eos_seen if self._any_eos else None)
        self._logits = None
        if self._emit(tokens, complete):
            # Logits set by hand skip a forward pass: earlier unrun tokens then run with this one.
            step = tokens[:, None]
            self._pending = step if self._pending is None else np.hstack([self._pending, step])
        if self._done:
            self._exec.finish()  # final-phase stages, once; their outputs via get_output()

    def _emit(self, tokens: np.ndarray, complete: np.ndarray | None = None) -> bool:
        """The one place a chosen token is handed out: EOS per row, max_length and "done".
        Returns whether the tokens were appended (the step that ends the last row is not); the
        caller runs the final stages once its books are square."""
        hit = self._stop.rows_ended(tokens, complete)
        # a finished grammar's last token is content: the step that ends the last row on it is
        # appended, unlike an EOS
        content_end = complete is not None and bool(
            (self._stop.on_content(tokens, complete) & ~self._eos_seen).any()
        )
        if hit.any():
            self._eos_seen |= hit
            self._any_eos = True
        self._next[:] = tokens
        if LOG.enabled:
            self._log_step(hit)
        all_ended = self._any_eos and bool(self._eos_seen.all())
        if all_ended and not content_end:
            # As the reference: the EOS step that ends the last row is reported by
            # get_next_tokens but not appended, and never runs (token_count excludes it).
            self._done = True
            return False
        self._seq[:, self._length] = tokens
        self._length += 1
        self._done = all_ended or self._stop.fills(self._length, self.max_length)
        return True

    def _beam_step(self) -> None:
        """The scorer picks each row's next token and the row it extends; the sequences and
        the cache follow those rows, then every row's token is appended (pad in finished
        prompts), as the reference does."""
        sequences = self._seq[:, : self._length]
        logits = self._picker.process(sequences, self._host_logits())
        tokens, rows = self._beams.step(sequences, logits)
        self._logits = None
        sequences[:] = sequences[rows]
        self._exec.reorder_rows(rows)
        if self._pending is not None:
            self._pending = self._pending[rows]
        self._next[:] = tokens
        if LOG.enabled:
            self._log_step(np.zeros(self._rows, bool))
        self._seq[:, self._length] = tokens
        self._length += 1
        # Logits set by hand skip a pass: unrun tokens follow their rows, then this step's.
        step = tokens[:, None]
        self._pending = step.copy() if self._pending is None else np.hstack([self._pending, step])
        self._done = self._beams.is_done or self._stop.fills(self._length, self.max_length)
        if self._done:
            self._exec.finish()

    def _hypothesis(self, index: Any, caller: str) -> tuple[float, np.ndarray]:
        """Beam search's ``index``-th returned sequence: prompt ``index // n``, its rank
        ``index % n`` (n = num_return_sequences), as (score, tokens)."""
        index = as_index(index, f"{caller}(index)")
        returned = self.search.num_return_sequences
        if not 0 <= index < self.batch_size * returned:
            raise GenerationError(
                f"sequence index {index} out of range [0, {self.batch_size * returned}) "
                "(batch_size x num_return_sequences)"
            )
        if self._length == 0:
            return 0.0, np.zeros(0, np.int32)
        results = self._beam_results
        if results is None:  # before the end: a snapshot, the search goes on unchanged
            results = self._beams.results(self._seq[:, : self._length])
            if self.is_done():
                self._beam_results = results
        return results[index // returned][index % returned]

    def _next_from_driver(self) -> None:
        """Hand out the next token of the driver's current round (running a round if none is
        left); the executor may have run ahead, so the books are squared when a round ends."""
        if not self._queue:
            state = DecodeState(
                self._seq[0], self._length,
                None if self._logits is None else self._host_logits()[0],
                self._exec, self._picker, self._rng, self._stop,
            )  # fmt: skip
            self._queue.extend(self._driver.round(state))
            self._logits = None
            self._pending = None
        appended = self._emit(np.array([self._queue.popleft()], np.int32))
        if not appended or self._done or not self._queue:
            self._sync()
        if self._done:
            self._exec.finish()

    def is_done(self) -> bool:
        self._live()
        return self._logits is None and self._done

    def get_next_tokens(self) -> np.ndarray:
        return self._next.copy()

    def get_sequence(self, index: int) -> np.ndarray:
        if self._beams is not None:
            return self._hypothesis(index, "get_sequence")[1].copy()
        index = as_index(index, "get_sequence(index)")
        if not 0 <= index < self.batch_size:
            raise GenerationError(f"sequence index {index} out of range [0, {self.batch_size})")
        return self._seq[index, : self._length].copy()

    def get_sequence_score(self, index: int) -> float:
        """Beam search: the score of ``get_sequence(index)``, its summed log-probabilities over
        ``length ** length_penalty`` (not in the reference, which keeps it internal)."""
        if self._beams is None:
            raise GenerationError("sequence scores exist only with beam search (num_beams > 1)")
        return float(self._hypothesis(index, "get_sequence_score")[0])

    def token_count(self) -> int:
        return self._length

    def get_logits(self) -> np.ndarray:
        """Logits for the next token, ``[B, 1, V]``; runs any pending token first."""
        self._sync()
        if self._logits is None:
            if self._pending is None:
                if self._any_eos and self._eos_seen.all():
                    raise GenerationError(
                        "no logits: generation ended on EOS (the EOS is not run); call "
                        "append_tokens or rewind_to first"
                    )
                raise GenerationError("no logits: call append_tokens first")
            self._logits = self._forward(self._pending)
            self._pending = None
        return self._host_logits().reshape(self._rows, 1, -1).copy()

    def set_logits(self, logits: Any) -> None:
        self._sync()
        array = as_array(logits, "set_logits(logits)").astype(np.float32)
        if array.size != self._rows * self.vocab_size:
            raise GenerationError(
                f"set_logits expects {self._rows}x{self.vocab_size} values, got shape {array.shape}"
            )
        self._logits = array.reshape(self._rows, self.vocab_size).copy()

    def rewind_to(self, length: int) -> None:
        """Keep the first ``length`` tokens; the next step recomputes logits after them."""
        length = as_index(length, "rewind_to(length)")
        self._sync()
        if length < 0 or length > self._length:
            raise GenerationError(
                f"cannot rewind to {length}: the sequence has {self._length} tokens"
            )
        if self._beams is not None:
            if length == self._length:
                return
            raise UnsupportedError("rewind_to is not supported with beam search (num_beams > 1)")
        if self.batch_size > 1 and 0 < length < self._exec.positions.prompt_length:
            raise GenerationError(
                "with batch_size > 1, rewind_to needs 0 or a length past the padded prompt"
            )
        if length == self._length and self._done and self._pending is None:
            return  # as the reference: a no-op, so a finished generator stays done
        if length == 0:
            self._exec.rewind_to(0)
            self._pending = None
        else:
            self._exec.rewind_to(length - 1)
            self._pending = self._seq[:, length - 1 : length].copy()
        self._length = length
        self._picker.rewind(self._seq[:, :length])
        self._logits = None
        # As the reference: EOS ids in the kept prefix (a chat prompt holds some) end nothing.
        self._eos_seen[:] = False
        self._any_eos = False
        self._done = False

    def get_output(self, name: str) -> np.ndarray:
        self._live()
        return self._exec.output(as_name(name, "get_output(name)"))

    def get_input(self, name: str) -> np.ndarray:
        self._live()
        if as_name(name, "get_input(name)") in self._exec.user_inputs:
            return self._exec.user_inputs[name].numpy().copy()
        raise GenerationError(f"no input {name!r} was set with set_model_input")

    def set_model_input(self, name: str, value: Any) -> None:
        as_name(name, "set_model_input(name)")
        array = np.ascontiguousarray(
            as_array(
                value.as_numpy() if hasattr(value, "as_numpy") else value,
                f"set_model_input({name!r}, value)",
            )
        )
        known = {f.name for s in self.model.plan.stages for f in s.feeds}
        if name not in known:
            raise GenerationError(
                f"no stage declares an input {name!r} (inputs: {', '.join(sorted(known))})"
            )
        self._exec.set_input(name, array, repeat=self.search.num_beams)

    def set_inputs(self, inputs: Any) -> None:
        """Set every named tensor (``og.NamedTensors`` or a dict); ``input_ids`` is the prompt,
        appended (and run, init stages first) after the other inputs are in place."""
        ids = None
        for name, value in inputs.items():
            if name == "input_ids":
                ids = value.as_numpy() if hasattr(value, "as_numpy") else value
            else:
                self.set_model_input(name, value)
        if ids is not None:
            self.append_tokens(ids)

    def set_active_adapter(self, adapters: Adapters, adapter_name: str) -> None:
        """Turn a loaded LoRA adapter on for this generator's runs from now on. Several may be
        on together when they set different tensors; all come from one ``Adapters``."""
        if not isinstance(adapters, Adapters):
            raise GenerationError(
                f"set_active_adapter(adapters, name): expected Adapters, got {shown(adapters)}"
            )
        if self._adapters is not None and adapters is not self._adapters:
            raise GenerationError("a generator takes its adapters from a single Adapters container")
        if adapter_name in self._adapter_of.values():
            return  # already on
        adapter = adapters.acquire(adapter_name, self)
        try:
            taken = next((t for t in adapter.tensors if t in self._adapter_of), None)
            if taken is not None:
                raise GenerationError(
                    f"adapter {adapter_name!r} sets {taken!r}, which active adapter "
                    f"{self._adapter_of[taken]!r} already sets"
                )
            bind_adapter(self._exec, adapter)  # checked against this generator's graphs too
        except Exception:
            adapters.release(adapter_name, self)
            raise
        self._adapters = adapters
        self._adapter_of.update(dict.fromkeys(adapter.tensors, adapter_name))

    @unlocked  # another thread may stop a run in flight
    def set_runtime_option(self, key: str, value: str) -> None:
        """``terminate_session`` "1" stops the run in flight and refuses further generation
        until "0"; any other key is an onnxruntime run config entry (as the reference)."""
        key, value = runtime_option(key, value)
        if key == TERMINATE:
            self._terminated = value == "1"
        apply_runtime_option(self._exec, key, value)

    def snapshot_state(self) -> None:
        """Keep the recurrent state as it is now, so ``rewind_to`` this point restores it (for
        speculative rollback); models without recurrent state have nothing to keep."""
        self._live()
        self._sync()
        self._exec.snapshot()

    def set_hidden_states(self, hidden_states: Any) -> None:
        """Stage the hidden states an MTP-style head reads on its next pass: the input the
        config's ``hidden_states`` role names (default ``hidden_states``), copied."""
        self._live()
        names = {
            s.session.inputs.get("hidden_states", "hidden_states") for s in self.model.plan.stages
        }
        users = {f.name for s in self.model.plan.stages for f in s.feeds_from("user")}
        taken = sorted(names & users)
        if not taken:
            raise GenerationError(
                f"set_hidden_states: no stage takes a hidden states input (looked for "
                f"{', '.join(sorted(names))} among the inputs no role, wire or cache feeds)"
            )
        array = as_array(hidden_states, "set_hidden_states(hidden_states)")
        self.set_model_input(taken[0], np.array(array, copy=True))

    # -- a prompt's keys/values out and in (not in the reference: ``run --prompt-cache``) --

    @property
    def kv_copy_obstacle(self) -> str | None:
        """Why ``read_kv`` / ``append_kv`` cannot run on this generator (None: they can)."""
        if self._beams is not None:
            return "beam search keeps a row per beam"
        if self._driver is not None:
            return f"{self.model.driver_kind} keeps state of its own besides the cache"
        if self._adapter_of:
            return "LoRA adapters are active (their keys/values differ from the model's)"
        return self._exec.copy_obstacle

    @property
    def kv_rows(self) -> tuple[np.dtype, tuple[int, int, int]]:
        """The dtype and ``(tensors, heads, head size)`` of one position's keys/values."""
        self._check_kv_copy()
        return self._exec.kv_rows

    def read_kv(self, start: int, end: int) -> np.ndarray:
        """A copy of the keys/values of positions ``start:end`` of the tokens run so far:
        ``[tensors, heads, end - start, head size]``."""
        self._check_kv_copy()
        return self._exec.read_kv(as_index(start, "read_kv(start)"), as_index(end, "read_kv(end)"))

    def append_kv(self, tokens: Any, rows: np.ndarray) -> None:
        """Start a new generator's sequence with ``tokens`` whose keys/values are ``rows`` (as
        ``read_kv`` gives them, from a generator of the same model and settings), without
        running them; ``append_tokens`` then runs the rest of the prompt and gives the logits.
        The rows are used as given: they must be what this model computes for these tokens."""
        self._check_kv_copy()
        if self._length:
            raise GenerationError("append_kv starts a sequence: rewind_to(0) first")
        ids = self._as_batch(tokens)
        rows = as_array(rows, "append_kv(rows)")
        n = ids.shape[1]
        if rows.ndim != 4 or rows.shape[2] != n:
            raise GenerationError(f"append_kv: rows {list(rows.shape)} do not hold {n} positions")
        if n >= self.max_length:
            raise GenerationError(f"append_kv: {n} tokens leave no room in max_length "
                                  f"{self.max_length}")  # fmt: skip
        self._exec.write_kv(0, rows)
        self._seq[:, :n] = ids
        self._length = n
        self._pending = None
        self._logits = None

    def _check_kv_copy(self) -> None:
        why = self.kv_copy_obstacle
        if why is not None:
            raise UnsupportedError(f"cannot copy keys/values: {why}")

    def get_speculative_stats(self) -> dict[str, float]:
        """Drafted and accepted token counts of speculative decoding (not in the reference)."""
        stats = None if self._driver is None else self._driver.stats()
        if stats is None:
            raise GenerationError("this generator does not decode speculatively")
        return stats

    # -- conveniences ----------------------------------------------------------------------

    def __iter__(self) -> Generator:
        return self

    def __next__(self) -> int | np.ndarray:
        if self.is_done():
            raise StopIteration
        self.generate_next_token()
        return int(self._next[0]) if self._rows == 1 else self._next.copy()

    @property
    def kv_cache(self):
        return self._exec.cache

    @property
    def graph_note(self) -> str:
        """Whether decode steps replay a captured CUDA graph, and why not where they do not."""
        return self._exec.graph_note

    # -- internals -------------------------------------------------------------------------

    def _log_step(self, hit: np.ndarray) -> None:
        if LOG.generate_next_token:
            log("generate_next_token", f"next tokens {self._next.tolist()}")
        if LOG.hit_eos:
            for row in np.flatnonzero(hit):
                log("hit_eos", f"EOS seen on batch {int(row)}")
        if LOG.hit_max_length and self._length + 1 >= self.max_length:
            log("hit_max_length", f"sequence reached max_length {self.max_length}")

    def _live(self) -> None:
        if self._terminated:
            raise GenerationError(
                "the session is terminated (set_runtime_option('terminate_session', '1')); "
                "set it to '0' to go on"
            )

    def _sync(self) -> None:
        """Drop a driver's tokens not handed out yet and square the books with its executor:
        every token before the pending ones has run, and no run token is past the sequence."""
        if self._driver is None:
            return
        self._queue.clear()
        length, ran = self._length, self._exec.length
        if ran >= length and not (self._logits is not None and ran == length):
            ran = max(length - 1, 0)
            self._exec.rewind_to(ran)
            self._logits = None
            self._driver.on_rewind(ran)
        self._pending = self._seq[:, ran:length].copy() if ran < length else None

    def _as_batch(self, tokens: Any) -> np.ndarray:
        array = as_array(tokens, "append_tokens(tokens)")
        if array.size == 0:
            raise GenerationError("append_tokens: no tokens given")
        if not np.issubdtype(array.dtype, np.integer):
            raise GenerationError(f"append_tokens: expected integer token ids, got {array.dtype}")
        if array.ndim == 1:
            if array.size % self.batch_size:
                raise GenerationError(
                    f"append_tokens: {array.size} tokens do not split into batch_size "
                    f"{self.batch_size} rows"
                )
            array = array.reshape(self.batch_size, -1)
        if array.ndim != 2 or array.shape[0] != self.batch_size:
            raise GenerationError(
                f"append_tokens: expected [{self.batch_size}, n] tokens, got shape {array.shape}"
            )
        bad = (array < 0) | (array >= self.vocab_size)
        if bad.any():
            row, col = (int(i) for i in np.argwhere(bad)[0])
            raise GenerationError(
                f"append_tokens: token id {int(array[row, col])} at [{row}, {col}] is outside "
                f"the vocabulary [0, {self.vocab_size})"
            )
        return array.astype(np.int32)

    def _host_logits(self) -> np.ndarray:
        if self._logits is ON_DEVICE:
            self._logits = self._exec.rows()
        return self._logits

    def _forward(self, tokens: np.ndarray) -> np.ndarray | object:
        """Run ``tokens``; their logits as a host array, or ON_DEVICE where they stay there."""
        chunk = self.search.chunk_size
        start = self._exec.length
        try:
            if chunk and tokens.shape[1] > chunk and self.batch_size == 1:
                for first in range(0, tokens.shape[1], chunk):
                    self._exec.run(tokens[:, first : first + chunk])
            else:
                self._exec.run(tokens)
            return ON_DEVICE if self._exec.logits_on_device else self._exec.rows()
        except Exception as exc:
            self._exec.rewind_to(start)  # a failed pass leaves the generator as it was
            self._live()  # a run stopped by terminate_session
            if isinstance(exc, GenaiRuntimeError):
                raise
            raise ModelError(f"model run failed: {exc}") from exc
