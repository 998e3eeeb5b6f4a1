"""onnxruntime-genai 0.18's Engine options and constants: ``RequestOptions``, ``TurnOptions``,
``FinishReason``, ``EngineEventFlags``, ``EngineErrorCode``, and how a turn's policy is resolved.

Every turn option starts unset, and unset means "the model's ``search`` default for this turn",
never "what the previous turn used". ``resolve_turn`` turns options plus the model's defaults
into a ``TurnPolicy`` and rejects contradictions (the reference's rules and wording) before the
request is touched, so a rejected turn leaves the request as it was.
"""

from __future__ import annotations

import enum
import math
import weakref
from dataclasses import dataclass
from typing import Any

from ..checks import is_integer, is_number
from ..decoding.guidance import GUIDANCE_KINDS
from ..errors import GenerationError
from ..spec import GenerationSpec
from .stops import check_stop_strings

_U64 = 1 << 64


class FinishReason(enum.IntEnum):
    NONE = 0
    EOS = 1
    STOP_STRING = 2
    MAX_GENERATED_TOKENS = 3
    MAX_SESSION_TOKENS = 4
    CANCELLED = 5
    FAILED = 6


class EngineEventFlags(enum.IntFlag):
    NONE = 0
    TOKEN = 1
    TURN_FINISHED = 2
    CAPACITY_BLOCKED = 4
    FAILED = 8
    RETRYABLE = 16


class EngineErrorCode(enum.IntEnum):
    NONE = 0
    CAPACITY_DEFERRED = 1
    EXECUTION_CAPACITY_EXCEEDED = 2
    RETRYABLE_EXECUTION = 3
    REQUEST_UNSERVICEABLE = 4
    ENGINE_CONTRACT_FAILURE = 5
    ENGINE_EXECUTION_FAILURE = 6


class EngineError(GenerationError):
    """An Engine, Request or turn used in a way its state does not allow (a RuntimeError, as
    the reference raises)."""


class EngineValueError(GenerationError, ValueError):
    """A value the Engine API cannot take (a ValueError, as the reference raises)."""


class EngineTypeError(GenerationError, TypeError):
    """An argument of the wrong type or out of its integer range (a TypeError, as the
    reference's bindings raise)."""


def unsigned(name: str, value: Any, *, bits: int = 64) -> int:
    """``value`` as an unsigned integer of ``bits`` bits, else ``EngineTypeError``."""
    if not is_integer(value) or not 0 <= value < 1 << bits:
        raise EngineTypeError(f"{name} expects an integer from 0 to 2**{bits} - 1, got {value!r}")
    return int(value)


def _int32(name: str, value: Any) -> int:
    """``value`` as a signed 32-bit integer (the reference's ``int`` arguments), else
    ``EngineTypeError``."""
    if not is_integer(value) or not -(1 << 31) <= value < 1 << 31:
        raise EngineTypeError(f"{name} expects a 32-bit integer, got {value!r}")
    return int(value)


def _real(name: str, value: Any) -> float:
    if not is_number(value):
        raise EngineTypeError(f"{name} expects a number, got {value!r}")
    return float(value)


class RequestOptions:
    """Options a Request keeps for its whole life (copied when the Request is created)."""

    def __init__(self) -> None:
        self.max_session_tokens = 0

    def set_max_session_tokens(self, value: int) -> None:
        """Total tokens (prompt plus generated, across every turn) the request may reach. Zero
        uses the model's ``search.max_length``."""
        self.max_session_tokens = unsigned("set_max_session_tokens", value)


class RequestHandle:
    """What ``TurnOptions`` binds to (``batching.engine.Request`` is one)."""


class TurnOptions:
    """One turn's generation policy, bound to the Request it was made for. Reusable: each
    ``begin_turn`` copies the options set at that moment; ``reset`` unsets them all."""

    def __init__(self, request: RequestHandle):
        if not isinstance(request, RequestHandle):
            raise EngineTypeError(f"TurnOptions expects a Request, got {type(request).__name__}")
        self._request = weakref.ref(request)  # it does not keep its Request alive
        self.reset()

    def bound_to(self, request: RequestHandle) -> bool:
        return self._request() is request

    def reset(self) -> None:
        """Restore every turn option to its unset state."""
        self.do_sample: bool | None = None
        self.temperature: float | None = None
        self.top_p: float | None = None
        self.top_k: int | None = None
        self.repetition_penalty: float | None = None
        self.no_repeat_ngram_size: int | None = None
        self.min_generated_tokens = 0
        self.max_generated_tokens = 0
        self.seed: int | None = None
        self.stop_strings: tuple[str, ...] = ()
        self.guidance: tuple[str, str] | None = None

    def set_do_sample(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise EngineTypeError(f"set_do_sample expects a bool, got {value!r}")
        self.do_sample = value

    def set_temperature(self, value: float) -> None:
        self.temperature = _real("set_temperature", value)

    def set_top_p(self, value: float) -> None:
        self.top_p = _real("set_top_p", value)

    def set_top_k(self, value: int) -> None:
        self.top_k = _int32("set_top_k", value)

    def set_repetition_penalty(self, value: float) -> None:
        self.repetition_penalty = _real("set_repetition_penalty", value)

    def set_no_repeat_ngram_size(self, value: int) -> None:
        self.no_repeat_ngram_size = _int32("set_no_repeat_ngram_size", value)

    def set_min_generated_tokens(self, value: int) -> None:
        """Mask end-of-sequence until this turn has generated this many tokens (0: no floor)."""
        self.min_generated_tokens = unsigned("set_min_generated_tokens", value)

    def set_max_generated_tokens(self, value: int) -> None:
        """Cap the tokens this turn generates (0: only the request's session limit)."""
        self.max_generated_tokens = unsigned("set_max_generated_tokens", value)

    def set_seed(self, value: int) -> None:
        """Reseed the request's random stream at the start of this turn (0 is a valid seed)."""
        self.seed = unsigned("set_seed", value)

    def clear_seed(self) -> None:
        self.seed = None

    def set_stop_strings(self, strings: list[str]) -> None:
        """Decoded stop strings for the turn (an empty list clears them)."""
        self.stop_strings = check_stop_strings(strings)

    def set_guidance(self, type: str, data: str) -> None:
        """Constrain this turn to a grammar: ``json_schema``, ``regex`` or ``lark_grammar``."""
        if not isinstance(type, str) or not isinstance(data, str):
            raise EngineTypeError("set_guidance expects two strings: type and data")
        if type not in GUIDANCE_KINDS:
            raise EngineError(
                f"Unsupported guidance type: {type} (only json_schema, regex, and lark_grammar "
                "are supported)."
            )
        self.guidance = (type, data)

    def clear_guidance(self) -> None:
        self.guidance = None


@dataclass(frozen=True)
class TurnPolicy:
    """A turn's resolved policy: what its picker is built from, plus its limits."""

    generation: GenerationSpec
    min_generated_tokens: int = 0
    max_generated_tokens: int = 0  # 0: only the session limit
    seed: int | None = None
    stop_strings: tuple[str, ...] = ()
    guidance: tuple[str, str] | None = None


def resolve_turn(
    options: TurnOptions | None, search: GenerationSpec, vocab_size: int
) -> TurnPolicy:
    """The policy of a turn: ``options`` over the model's ``search`` defaults, validated."""
    o = options if options is not None else _UNSET
    do_sample = search.do_sample if o.do_sample is None else o.do_sample
    temperature = search.temperature if o.temperature is None else o.temperature
    top_p = search.top_p if o.top_p is None else o.top_p
    top_k = search.top_k if o.top_k is None else o.top_k
    penalty = search.repetition_penalty if o.repetition_penalty is None else o.repetition_penalty
    ngram = (
        search.no_repeat_ngram_size if o.no_repeat_ngram_size is None else o.no_repeat_ngram_size
    )

    if not math.isfinite(temperature) or temperature < 0:
        raise EngineError(f"temperature must be finite and >= 0, got {temperature}")
    if not 0.0 <= top_p <= 1.0:
        raise EngineError(f"top_p must be between 0.0 and 1.0, got {top_p}")
    if top_k < 0:
        raise EngineError(f"top_k must be >= 0, got {top_k}")
    if not math.isfinite(penalty) or penalty <= 0:
        raise EngineError(f"repetition_penalty must be finite and greater than zero, got {penalty}")
    if ngram < 0:
        raise EngineError(f"no_repeat_ngram_size must be >= 0, got {ngram}")

    if not do_sample:
        contradicting = [
            name
            for name, value, neutral in (
                ("temperature", o.temperature, (0.0, 1.0)),
                ("top_p", o.top_p, (0.0, 1.0)),
                ("top_k", o.top_k, (0, 1)),
            )
            if value is not None and value not in neutral
        ]
        if contradicting:
            raise EngineError(
                "The resolved turn policy selects the top logit (do_sample is false), so these "
                f"explicitly set sampling options contradict it: {', '.join(contradicting)}. "
                "Either remove them or request sampling with do_sample=true, top_k != 1, and a "
                "nonzero temperature."
            )
    elif o.do_sample:
        # An explicit do_sample that a model default the caller cannot see would override.
        for name, value, explicit, greedy in (
            ("top_k", top_k, o.top_k, 1),
            ("temperature", temperature, o.temperature, 0.0),
        ):
            if value == greedy and explicit is None and o.top_k != 1 and o.temperature != 0.0:
                raise EngineError(
                    f"do_sample=true was requested, but the model default search.{name} = "
                    f"{greedy:g} selects the top logit; set {name} on the turn to sample."
                )
    generation = GenerationSpec(
        do_sample=do_sample, temperature=temperature, top_p=top_p, top_k=top_k,
        repetition_penalty=penalty, no_repeat_ngram_size=ngram,
    )  # fmt: skip
    if not generation.is_greedy:
        if top_k == 0 and top_p == 0.0:
            raise EngineError(
                "A sampled turn requires a positive top_k or a positive top_p; both are 0."
            )
        if top_k > vocab_size:
            raise EngineError(
                f"top_k ({top_k}) must be less than or equal to vocab_size ({vocab_size})."
            )
    return TurnPolicy(
        generation, o.min_generated_tokens, o.max_generated_tokens, o.seed, o.stop_strings,
        o.guidance,
    )  # fmt: skip


class _Unset:
    """Every option unset: a turn begun without ``TurnOptions``."""

    do_sample = temperature = top_p = top_k = None
    repetition_penalty = no_repeat_ngram_size = seed = guidance = None
    min_generated_tokens = max_generated_tokens = 0
    stop_strings: tuple[str, ...] = ()


_UNSET = _Unset()
