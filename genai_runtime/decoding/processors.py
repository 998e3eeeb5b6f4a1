"""Logits processors: small callables that reshape next-token scores before a token is chosen.

A processor is ``processor(tokens, logits) -> logits`` where ``tokens`` is the int32 ``[B, T]``
sequence so far (prompt + generated, right-padding pad tokens included, as onnxruntime-genai
sees it) and ``logits`` the float32 ``[B, V]`` scores for the next position. Processors modify
``logits`` **in place** and return it: the caller passes a buffer it owns.

Temperature, top-k, top-p and min-p are not processors here: the reference order fuses them into
its sampler (``decoding.sampling``); a v2 chain runs them as separate ops (``decoding.warpers``).

Masking uses the lowest finite float32 (not -inf), like the reference, so a fully masked row
still has a finite softmax. Token ids outside ``[0, V)`` are ignored everywhere.

Parameters are checked when a processor is built (``ConfigError``), never per token. Each
processor exposes ``active``; ``make_chain`` drops the ones that would change nothing. Some keep
scratch buffers between calls, so build one chain per generator (instances are not
thread-safe).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..checks import is_integer, is_number
from ..errors import ConfigError, ConfigProblem
from ..spec import GenerationSpec, ProcessorSpec

Processor = Callable[[np.ndarray, np.ndarray], np.ndarray]

LOWEST = np.finfo(np.float32).min


# --- build-time parameter checks -----------------------------------------------------------


def _int(name: str, value: Any, *, minimum: int) -> int:
    if not is_integer(value):
        raise ConfigError.at(name, f"expected an integer, got {value!r}")
    if value < minimum:
        raise ConfigError.at(name, f"must be >= {minimum}, got {value}")
    return int(value)


def _real(name: str, value: Any, *, positive: bool = False) -> float:
    if not is_number(value):
        raise ConfigError.at(name, f"expected a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError.at(name, f"must be finite, got {value}")
    if positive and value <= 0.0:
        raise ConfigError.at(name, f"must be > 0, got {value}")
    return value


def _token_id(name: str, value: Any) -> int:
    # JSON object keys arrive as strings ("50256"), so accept decimal strings too.
    if isinstance(value, str):
        try:
            return int(value.strip(), 10)
        except ValueError:
            raise ConfigError.at(name, f"expected a token id, got {value!r}") from None
    if not is_integer(value):
        raise ConfigError.at(name, f"expected a token id, got {value!r}")
    return int(value)


def _token_ids(name: str, value: Any) -> tuple[int, ...]:
    if is_integer(value) or isinstance(value, str):
        return (_token_id(name, value),)
    if isinstance(value, Mapping) or not isinstance(value, Iterable):
        raise ConfigError.at(name, f"expected a list of token ids, got {value!r}")
    return tuple(_token_id(f"{name}[{i}]", v) for i, v in enumerate(value))


class _IdSet:
    """A fixed set of token ids, with the in-range subset cached per vocabulary size."""

    __slots__ = ("_in_range", "_vocab", "ids")

    def __init__(self, ids: Iterable[int], vocab_size: int | None = None):
        self.ids = np.unique(np.fromiter(ids, dtype=np.int64))
        self._vocab = -1
        self._in_range = self.ids
        if vocab_size is not None:
            self.within(vocab_size)

    def within(self, vocab: int) -> np.ndarray:
        if vocab != self._vocab:
            self._in_range = self.ids[(self.ids >= 0) & (self.ids < vocab)]
            self._vocab = vocab
        return self._in_range


def _flat_ids(tokens: np.ndarray, vocab: int) -> np.ndarray:
    """Each in-range id of each row as a flat index ``row * vocab + id`` into ``[B, V]``."""
    t = tokens.astype(np.int64)
    valid = (t >= 0) & (t < vocab)
    t += np.arange(0, t.shape[0] * vocab, vocab, dtype=np.int64)[:, None]
    return t[valid]


class _DistinctIds:
    """The distinct in-range ids of each row, in O(B*T) with a reused ``[B*V]`` scratch.

    Each id's slot receives the position of its occurrences (the last write wins), so exactly one
    occurrence per id reads its own position back. Only slots written in the same call are
    read, so the scratch never needs clearing.
    """

    __slots__ = ("_slots",)

    def __init__(self) -> None:
        self._slots = np.empty(0, dtype=np.int32)

    def __call__(self, tokens: np.ndarray, vocab: int) -> tuple[np.ndarray, np.ndarray]:
        flat = _flat_ids(tokens, vocab)
        if self._slots.size < tokens.shape[0] * vocab:
            self._slots = np.empty(tokens.shape[0] * vocab, dtype=np.int32)
        position = np.arange(flat.size, dtype=np.int32)
        self._slots[flat] = position
        distinct = flat[self._slots[flat] == position]
        return np.divmod(distinct, vocab)


# --- processors ----------------------------------------------------------------------------


class MinLength:
    """Forbid every EOS id while the sequence is shorter than ``min_length``.

    ``T`` (the length before the predicted token is appended) is compared, as in the
    reference's ``ApplyMinLengthToLogits``.
    """

    def __init__(
        self, min_length: int, eos_token_ids: Sequence[int], *, vocab_size: int | None = None
    ):
        self.min_length = _int("min_length", min_length, minimum=0)
        self._eos = _IdSet(_token_ids("eos_token_ids", eos_token_ids), vocab_size)

    @property
    def active(self) -> bool:
        return self.min_length > 0 and self._eos.ids.size > 0

    def __call__(self, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        if tokens.shape[1] < self.min_length:
            ids = self._eos.within(logits.shape[1])
            if ids.size:
                logits[:, ids] = LOWEST
        return logits

    def __repr__(self) -> str:
        return f"MinLength({self.min_length}, eos={self._eos.ids.tolist()})"


class RepetitionPenalty:
    """HF/CTRL repetition penalty over the distinct ids of each row's sequence.

    ``score < 0 -> score * penalty`` else ``score / penalty``, in float32 like the reference
    (so a masked ``LOWEST`` times a penalty > 1 overflows to -inf there and here).
    """

    def __init__(self, penalty: float):
        self.penalty = _real("penalty", penalty, positive=True)
        self._p = np.float32(self.penalty)
        self._distinct = _DistinctIds()

    @property
    def active(self) -> bool:
        return self._p != np.float32(1.0)

    def __call__(self, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        rows, ids = self._distinct(tokens, logits.shape[1])
        scores = logits[rows, ids]
        with np.errstate(over="ignore"):
            logits[rows, ids] = np.where(scores < 0, scores * self._p, scores / self._p)
        return logits

    def __repr__(self) -> str:
        return f"RepetitionPenalty({self.penalty})"


class NoRepeatNgram:
    """Ban every token that would complete an n-gram already present in the sequence.

    Scans all starts ``0 .. T-n`` (as the reference's ``ApplyNoRepeatNgram``): where the
    window ``tokens[s : s+n-1]`` equals the trailing ``n-1`` tokens, ``tokens[s+n-1]`` is banned.
    Nothing happens while ``T < n``; ``n == 1`` bans every token seen so far.
    """

    def __init__(self, ngram_size: int):
        self.ngram_size = _int("ngram_size", ngram_size, minimum=0)

    @property
    def active(self) -> bool:
        return self.ngram_size > 0

    def __call__(self, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        n = self.ngram_size
        length = tokens.shape[1]
        if n <= 0 or length < n:
            return logits
        starts = length - n + 1  # number of candidate windows
        # Build the match mask one prefix column at a time: O(B*T) memory whatever n is.
        match = np.ones((tokens.shape[0], starts), dtype=bool)
        for j in range(n - 1):
            match &= tokens[:, j : j + starts] == tokens[:, length - n + 1 + j, None]
        rows, start = np.nonzero(match)
        banned = tokens[rows, start + n - 1]
        ok = (banned >= 0) & (banned < logits.shape[1])
        logits[rows[ok], banned[ok]] = LOWEST
        return logits

    def __repr__(self) -> str:
        return f"NoRepeatNgram({self.ngram_size})"


class PresencePenalty:
    """OpenAI-style: subtract ``penalty`` once from every id present in the sequence.

    Counts over the whole sequence (prompt included), like the repetition penalty.
    """

    def __init__(self, penalty: float):
        self.penalty = _real("penalty", penalty)
        self._p = np.float32(self.penalty)
        self._distinct = _DistinctIds()

    @property
    def active(self) -> bool:
        return self.penalty != 0.0

    def __call__(self, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        rows, ids = self._distinct(tokens, logits.shape[1])
        logits[rows, ids] -= self._p
        return logits

    def __repr__(self) -> str:
        return f"PresencePenalty({self.penalty})"


class FrequencyPenalty:
    """OpenAI-style: subtract ``penalty * count`` from every id, counted over the whole sequence."""

    def __init__(self, penalty: float):
        self.penalty = _real("penalty", penalty)
        self._p = np.float32(self.penalty)

    @property
    def active(self) -> bool:
        return self.penalty != 0.0

    def __call__(self, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        vocab = logits.shape[1]
        flat, counts = np.unique(_flat_ids(tokens, vocab), return_counts=True)
        rows, ids = np.divmod(flat, vocab)
        logits[rows, ids] -= counts.astype(np.float32) * self._p
        return logits

    def __repr__(self) -> str:
        return f"FrequencyPenalty({self.penalty})"


class LogitBias:
    """Add a fixed bias per token id (``{token_id: bias}``; -inf allowed to forbid a token)."""

    def __init__(self, bias: Mapping[Any, float], *, vocab_size: int | None = None):
        if not isinstance(bias, Mapping):
            raise ConfigError.at("bias", f"expected a mapping {{token_id: bias}}, got {bias!r}")
        merged: dict[int, float] = {}
        for key, value in bias.items():
            tid = _token_id(f"bias[{key!r}]", key)
            if tid in merged:
                raise ConfigError.at(f"bias[{key!r}]", f"token id {tid} given twice")
            if not is_number(value) or math.isnan(value):
                raise ConfigError.at(f"bias[{key!r}]", f"expected a number, got {value!r}")
            if value == math.inf:
                raise ConfigError.at(f"bias[{key!r}]", "+inf is not a usable bias")
            merged[tid] = float(value)
        self.bias = merged
        self._ids = np.fromiter(merged, dtype=np.int64, count=len(merged))
        self._values = np.fromiter(merged.values(), dtype=np.float32, count=len(merged))
        self._vocab = -1
        self._sel: tuple[np.ndarray, np.ndarray] = (self._ids, self._values)
        if vocab_size is not None:
            self._select(vocab_size)

    def _select(self, vocab: int) -> tuple[np.ndarray, np.ndarray]:
        if vocab != self._vocab:
            ok = (self._ids >= 0) & (self._ids < vocab)
            self._sel = (self._ids[ok], self._values[ok])
            self._vocab = vocab
        return self._sel

    @property
    def active(self) -> bool:
        return bool(self.bias)

    def __call__(self, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        ids, values = self._select(logits.shape[1])
        if ids.size:
            logits[:, ids] += values
        return logits

    def __repr__(self) -> str:
        return f"LogitBias({self.bias})"


class SuppressTokens:
    """Never produce the given ids (masked with the lowest float32)."""

    def __init__(self, ids: Sequence[int], *, vocab_size: int | None = None):
        self._ids = _IdSet(_token_ids("ids", ids), vocab_size)

    @property
    def active(self) -> bool:
        return self._ids.ids.size > 0

    def __call__(self, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        ids = self._ids.within(logits.shape[1])
        if ids.size:
            logits[:, ids] = LOWEST
        return logits

    def __repr__(self) -> str:
        return f"SuppressTokens({self._ids.ids.tolist()})"


class MinNewTokens:
    """Forbid every EOS id until ``min_new_tokens`` tokens follow the prompt.

    The prompt ends where the last ``append_tokens`` left the sequence; the generator reports
    it through ``start`` (a chain built outside a generator counts from the first call's length).
    """

    def __init__(
        self, min_new_tokens: int, eos_token_ids: Sequence[int], *, vocab_size: int | None = None
    ):
        self.min_new_tokens = _int("min_new_tokens", min_new_tokens, minimum=0)
        self._eos = _IdSet(_token_ids("eos_token_ids", eos_token_ids), vocab_size)
        self.prompt_length: int | None = None

    @property
    def active(self) -> bool:
        return self.min_new_tokens > 0 and self._eos.ids.size > 0

    def start(self, prompt_length: int) -> None:
        self.prompt_length = prompt_length

    def __call__(self, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        if self.prompt_length is None:
            self.prompt_length = tokens.shape[1]
        if tokens.shape[1] - self.prompt_length < self.min_new_tokens:
            ids = self._eos.within(logits.shape[1])
            if ids.size:
                logits[:, ids] = LOWEST
        return logits

    def __repr__(self) -> str:
        return f"MinNewTokens({self.min_new_tokens}, eos={self._eos.ids.tolist()})"


class BadWords:
    """Never complete one of the given token sequences.

    A one-token sequence is always banned; a longer one bans its last token in the rows whose
    trailing tokens equal the rest of it.
    """

    def __init__(self, sequences: Sequence[Sequence[int]], *, vocab_size: int | None = None):
        if isinstance(sequences, (str, Mapping)) or not isinstance(sequences, Iterable):
            raise ConfigError.at(
                "sequences", f"expected a list of token-id lists, got {sequences!r}"
            )
        parsed = []
        for i, seq in enumerate(sequences):
            if isinstance(seq, (str, Mapping)) or not isinstance(seq, Iterable):
                raise ConfigError.at(
                    f"sequences[{i}]", f"expected a list of token ids, got {seq!r}"
                )
            ids = tuple(_token_id(f"sequences[{i}][{j}]", t) for j, t in enumerate(seq))
            if not ids:
                raise ConfigError.at(f"sequences[{i}]", "an empty sequence bans nothing")
            parsed.append(ids)
        self.sequences = tuple(parsed)
        self._single = _IdSet([s[0] for s in parsed if len(s) == 1], vocab_size)
        self._longer = [(np.array(s[:-1], np.int32), s[-1]) for s in parsed if len(s) > 1]

    @property
    def active(self) -> bool:
        return bool(self.sequences)

    def __call__(self, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        vocab = logits.shape[1]
        ids = self._single.within(vocab)
        if ids.size:
            logits[:, ids] = LOWEST
        for prefix, last in self._longer:
            if 0 <= last < vocab and tokens.shape[1] >= prefix.size:
                rows = (tokens[:, tokens.shape[1] - prefix.size :] == prefix).all(axis=1)
                logits[rows, last] = LOWEST
        return logits

    def __repr__(self) -> str:
        return f"BadWords({[list(s) for s in self.sequences]})"


class ProcessorChain:
    """Processors applied in order, each on the previous one's output (in place)."""

    def __init__(self, processors: Sequence[Processor]):
        self.processors: tuple[Processor, ...] = tuple(processors)

    def __call__(self, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        for processor in self.processors:
            logits = processor(tokens, logits)
        return logits

    def __len__(self) -> int:
        return len(self.processors)

    def __repr__(self) -> str:
        return f"ProcessorChain({list(self.processors)!r})"


# kind -> factory. Factories take the entry's params as keywords; ``eos_token_ids`` and
# ``vocab_size`` are supplied by ``build_processor`` when a factory accepts them and the entry
# does not set them.
PROCESSORS: dict[str, Callable[..., Processor]] = {
    "min_length": MinLength,
    "repetition_penalty": RepetitionPenalty,
    "no_repeat_ngram": NoRepeatNgram,
    "presence_penalty": PresencePenalty,
    "frequency_penalty": FrequencyPenalty,
    "logit_bias": LogitBias,
    "suppress_tokens": SuppressTokens,
    "min_new_tokens": MinNewTokens,
    "bad_words": BadWords,
}


def _at(path: str, name: str) -> str:
    return f"{path}.{name}" if path and name else path or name


def build_processor(
    spec: ProcessorSpec,
    *,
    path: str = "",
    eos_token_ids: Sequence[int] = (),
    vocab_size: int | None = None,
    registry: Mapping[str, Callable[..., Processor]] = PROCESSORS,
    valid: Sequence[str] | None = None,
) -> Processor:
    """Build one processor from ``registry`` (default: the processors) for one chain entry.

    Unknown kinds (the message lists ``valid``, default the registry's keys), unknown or missing
    parameters and bad values raise ``ConfigError`` with problems located under ``path``.
    """
    factory = registry.get(spec.kind)
    if factory is None:
        expected = ", ".join(valid if valid is not None else registry)
        message = f"unknown op {spec.kind!r} (expected one of: {expected})"
        raise ConfigError.at(_at(path, "op"), message)
    accepted = inspect.signature(factory).parameters
    unknown = sorted(set(spec.params) - set(accepted))
    if unknown:
        expected = ", ".join(n for n in accepted if n != "vocab_size")
        message = f"unexpected parameter for {spec.kind!r} (expected: {expected})"
        raise ConfigError([ConfigProblem(_at(path, name), message) for name in unknown])
    kwargs = dict(spec.params)
    if "eos_token_ids" in accepted:
        kwargs.setdefault("eos_token_ids", tuple(eos_token_ids))
    if "vocab_size" in accepted and vocab_size is not None:
        kwargs.setdefault("vocab_size", vocab_size)
    missing = [
        n
        for n, p in accepted.items()
        if p.default is inspect.Parameter.empty
        and p.kind is not inspect.Parameter.VAR_KEYWORD
        and n not in kwargs
    ]
    if missing:
        raise ConfigError(
            [
                ConfigProblem(_at(path, n), f"missing parameter required by {spec.kind!r}")
                for n in missing
            ]
        )
    try:
        return factory(**kwargs)
    except ConfigError as error:
        raise ConfigError(
            [ConfigProblem(_at(path, p.path), p.message) for p in error.problems]
        ) from None


def make_chain(
    generation: GenerationSpec, *, eos_token_ids: Sequence[int], vocab_size: int
) -> ProcessorChain | None:
    """The reference's built-in processors, in its order, or None when none would change anything.

    Order: min_length, repetition_penalty, no_repeat_ngram (each only when active), as
    onnxruntime-genai applies them. ``generation.logits`` is not read here: when given it is the
    whole chain (``decoding.chain.make_decoder``). Every bad value is reported in one
    ``ConfigError`` at its generation field.
    """
    if not is_integer(vocab_size):
        raise ConfigError(
            [ConfigProblem("model.vocab_size", f"expected an integer, got {vocab_size!r}")]
        )
    if vocab_size <= 0:
        raise ConfigError.at("model.vocab_size", f"must be > 0, got {vocab_size}")
    entries: list[tuple[ProcessorSpec, str]] = []
    if generation.min_length != 0:
        spec = ProcessorSpec("min_length", {"min_length": generation.min_length})
        entries.append((spec, "generation.min_length"))
    if generation.repetition_penalty != 1.0:
        spec = ProcessorSpec("repetition_penalty", {"penalty": generation.repetition_penalty})
        entries.append((spec, "generation.repetition_penalty"))
    if generation.no_repeat_ngram_size != 0:
        spec = ProcessorSpec("no_repeat_ngram", {"ngram_size": generation.no_repeat_ngram_size})
        entries.append((spec, "generation.no_repeat_ngram_size"))

    chain: list[Processor] = []
    problems: list[ConfigProblem] = []
    for spec, path in entries:
        try:
            processor = build_processor(
                spec, eos_token_ids=eos_token_ids, vocab_size=int(vocab_size)
            )
        except ConfigError as error:
            problems += [ConfigProblem(path, p.message) for p in error.problems]
            continue
        if getattr(processor, "active", True):
            chain.append(processor)
    if problems:
        raise ConfigError(problems)
    return ProcessorChain(chain) if chain else None
