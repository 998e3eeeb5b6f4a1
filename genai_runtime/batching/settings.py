"""One request's decoding settings in OpenAI's terms, for everything that takes requests: the
OpenAI server, the batch runner and Ray Data.

Each value is checked here, once. A search option's range is ``GenerationSpec``'s own (its field
metadata, the one place ``set_search_options`` reads too), narrowed only where OpenAI's API is
narrower (temperature at most 2).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..decoding.processors import FrequencyPenalty, LogitBias, PresencePenalty, Processor
from ..errors import GenerationError
from ..spec import GenerationSpec
from ..validation import shown

_OPTION = {f.name: f.metadata for f in fields(GenerationSpec)}
_OPENAI_HIGH = {"temperature": 2.0}
INT64 = (-(2**63), 2**63 - 1)


class SettingError(GenerationError, ValueError):
    """A request setting out of its type or range; ``param`` names it (the server's 400)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def option_range(name: str) -> tuple[float | None, float | None]:
    """The range a request may give search option ``name``."""
    meta = _OPTION[name]
    return meta["low"], _OPENAI_HIGH.get(name, meta["high"])


def check_number(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    integer: bool = False,
) -> Any:
    """``value`` as a finite number in ``[low, high]`` (None: open), an int when ``integer``
    (a float with an integral value is one: JSON writes 5 as 5.0 at times); else
    ``SettingError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        kind = "an integer" if integer else "a number"
        raise SettingError(f"{name} must be {kind}, got {shown(value)}", name)
    if not math.isfinite(value):
        raise SettingError(f"{name} must be a finite number, got {value}", name)
    if integer:
        if not isinstance(value, numbers.Integral) and not float(value).is_integer():
            raise SettingError(f"{name} must be an integer, got {shown(value)}", name)
        value = int(value)
    else:
        value = float(value)
    if (low is not None and value < low) or (high is not None and value > high):
        if high is None:
            bound = f">= {low}"
        else:
            bound = f"<= {high}" if low is None else f"in [{low}, {high}]"
        raise SettingError(f"{name} must be {bound}, got {value}", name)
    return value


@dataclass(frozen=True)
class RequestSettings:
    """How one request decodes, in OpenAI's meanings: temperature 0 or top_k 1 is greedy, top_k
    0 keeps the whole vocabulary, no seed draws a random one, no ``max_tokens`` runs to what the
    context leaves. The defaults are greedy; the server applies OpenAI's wire defaults (such as
    temperature 1) to fields a body leaves out."""

    max_tokens: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    response_format: Mapping[str, Any] | None = None
    # OpenAI's: added to a token's logit (-100 bans it, +100 all but forces it); penalties per
    # token already in the sequence (once / per occurrence), applied before temperature
    logit_bias: Mapping[int, float] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        checked = {
            name: check_number(name, getattr(self, name), *option_range(name), integer=integer)
            for name, integer in (("temperature", False), ("top_p", False), ("top_k", True))
        }
        if self.max_tokens is not None:
            checked["max_tokens"] = check_number("max_tokens", self.max_tokens, 1, integer=True)
        if self.seed is not None:
            checked["seed"] = check_number("seed", self.seed, *INT64, integer=True)
        for name in ("presence_penalty", "frequency_penalty"):
            checked[name] = check_number(name, getattr(self, name), -2.0, 2.0)
        if self.logit_bias is not None:
            checked["logit_bias"] = _logit_bias(self.logit_bias)
        for name, value in checked.items():  # normalised: 5.0 -> 5, numpy scalars -> Python
            object.__setattr__(self, name, value)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def generation(self) -> GenerationSpec:
        """The search options these settings decode with."""
        return GenerationSpec.from_openai(self.temperature, self.top_p, self.top_k)

    def ops(self, vocab_size: int) -> list[Processor]:
        """The logits ops these settings add before the model's own (bias, then penalties); a
        biased id outside the vocabulary is a ``SettingError``."""
        out: list[Processor] = []
        if self.logit_bias:
            outside = [t for t in self.logit_bias if t >= vocab_size]
            if outside:
                raise SettingError(
                    f"logit_bias: token id {outside[0]} is outside the vocabulary (0..."
                    f"{vocab_size - 1})",
                    "logit_bias",
                )
            out.append(LogitBias(self.logit_bias, vocab_size=vocab_size))
        if self.presence_penalty:
            out.append(PresencePenalty(self.presence_penalty))
        if self.frequency_penalty:
            out.append(FrequencyPenalty(self.frequency_penalty))
        return out


MAX_LOGIT_BIAS = 1024  # entries: each is one id's column, per step


def _logit_bias(value: Any) -> dict[int, float]:
    """``{token id: bias}`` from OpenAI's form (ids as JSON strings), each bias in [-100, 100]."""
    if not isinstance(value, Mapping):
        raise SettingError("logit_bias must be an object {token id: bias}", "logit_bias")
    if len(value) > MAX_LOGIT_BIAS:
        raise SettingError(
            f"logit_bias has {len(value)} entries; at most {MAX_LOGIT_BIAS}", "logit_bias"
        )
    out = {}
    for key, bias in value.items():
        text = str(key)
        if not text.isdigit() or len(text) > 9:
            raise SettingError(f"logit_bias: {shown(key)} is not a token id", "logit_bias")
        try:
            out[int(text)] = check_number(f"logit_bias[{text}]", bias, -100.0, 100.0)
        except SettingError as exc:  # the field is the param; the message names the entry
            raise SettingError(str(exc), "logit_bias") from None
    return out
