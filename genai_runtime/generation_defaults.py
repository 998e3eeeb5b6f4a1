"""What ``run`` and ``chat`` generate with when the command line names no sampling and no length.

Greedy decoding with no cap short of the context loops for minutes on small models; llama.cpp
and ollama sample by default and mlx-lm caps new tokens. Where the sampling comes from, first
match wins:

1. the folder's config, when its search options sample (the reference builder copies a
   checkpoint's ``generation_config.json`` into them);
2. the makers' recommended settings an import recorded in ``generation_config.json`` (a Hugging
   Face checkpoint's own, or a GGUF file's ``general.sampling.*`` keys);
3. ``DEFAULT_SAMPLING`` below.

``--greedy`` or any sampling flag replaces all three. The Python API keeps onnxruntime-genai's
defaults (the config's search options); these are the command line's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .config.bounded import LimitError, Limits, load_json, read_bounded
from .errors import ConfigError, ConfigProblem
from .folder_paths import folder_file
from .spec import GenerationSpec, PipelineSpec

SAMPLING_FILE = "generation_config.json"
# ollama's top_k and top_p; a temperature a little under its 0.8, as small models drift
DEFAULT_SAMPLING = MappingProxyType(
    {"do_sample": True, "temperature": 0.7, "top_k": 40, "top_p": 0.9}
)
DEFAULT_MAX_NEW_TOKENS = 512  # run's reply cap, and chat's per reply, when no flag names one
LOOP_SPAN = 64  # a reply ends once its last 64+ tokens are one block repeated (3+ copies)

_KEYS = ("do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty")
_OPTION = {f.name: f for f in fields(GenerationSpec)}
_LIMITS = Limits(max_bytes=64 * 1024, max_depth=8, max_nodes=1000, max_aliases=0)


@dataclass(frozen=True)
class Defaults:
    """The sampling ``run`` and ``chat`` add when no flag names any, and where it comes from."""

    sampling: MappingProxyType
    source: str
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    loop_span: int = LOOP_SPAN

    def describe(self) -> str:
        """One line for ``explain``, ``show`` and ``run``'s note."""
        what = ", ".join(f"{k} {v}" for k, v in self.sampling.items()) or "the config's search"
        return (
            f"{what} ({self.source}); at most {self.max_new_tokens} new tokens; a reply that "
            f"repeats one block over its last {self.loop_span}+ tokens ends"
        )


def defaults_for(spec: PipelineSpec) -> Defaults:
    """The defaults in force for a loaded config (see the module docstring)."""
    return defaults_in(spec.model_dir, spec.generation.do_sample)


def defaults_in(model_dir: Path | None, config_samples: bool) -> Defaults:
    """The defaults in force for a folder whose config samples (or not)."""
    if config_samples:
        return Defaults(MappingProxyType({}), "the model config samples")
    recorded = recommended_sampling(model_dir)
    if recorded:
        return Defaults(MappingProxyType(recorded), f"the makers' settings, {SAMPLING_FILE}")
    return Defaults(DEFAULT_SAMPLING, "genai_runtime's defaults")


def recommended_sampling(model_dir: Path | None) -> dict[str, Any]:
    """The search options a folder's ``generation_config.json`` recommends (``{}`` without one);
    a value of the wrong type or out of its option's range is a ``ConfigError`` naming it."""
    if model_dir is None or not (model_dir / SAMPLING_FILE).is_file():
        return {}
    path = folder_file(model_dir, SAMPLING_FILE)
    try:
        doc = load_json(read_bounded(path, _LIMITS.max_bytes), _LIMITS)
    except (OSError, UnicodeError, json.JSONDecodeError, LimitError) as exc:
        raise _problem(path, "", f"cannot be read: {exc}") from None
    if not isinstance(doc, dict):
        raise _problem(path, "", "expected a JSON object")
    out = {}
    for key in _KEYS:
        value = doc.get(key)
        if value is not None:
            out[key] = _checked(path, key, value)
    return out


def _checked(path: Path, key: str, value: Any) -> Any:
    option = _OPTION[key]
    if option.type in (bool, "bool"):
        if not isinstance(value, bool):
            raise _problem(path, key, f"expected true or false, got {value!r}")
        return value
    integer = option.type in (int, "int")
    ok = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value):
        raise _problem(path, key, f"expected {'an integer' if integer else 'a number'}")
    low, high = option.metadata["low"], option.metadata["high"]
    if (low is not None and value < low) or (high is not None and value > high):
        raise _problem(path, key, f"{value} is outside [{low}, {high if high is not None else ''}]")
    return value


def _problem(path: Path, key: str, message: str) -> ConfigError:
    return ConfigError([ConfigProblem(f"{path.name}{'.' + key if key else ''}", message)])
