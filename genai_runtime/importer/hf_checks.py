"""Checks on a Hugging Face folder's ``config.json`` and files, made before anything is sized
from them.

A folder is untrusted input: ``num_hidden_layers`` sizes the importer's per-layer loops,
``max_position_embeddings`` and ``sliding_window`` the runtime's caches, the rope keys its
tables. Every value the reader uses is checked here against the bounds the GGUF import uses
too (``bounds.SHAPES``), for its type and range; a failure is a ``ModelError`` naming the file
and the key. Files are opened only when they are regular files (a FIFO would block the reader).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import ModelError
from .bounds import SHAPES, shown

Check = Callable[[Any], str | None]
MAX_PROBLEMS = 6  # a message names the first few (a fuzzed file can have hundreds)


def _flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"expected a boolean, got {shown(value)}"


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) else f"expected a string, got {shown(value)}"


def _object(value: Any) -> str | None:
    return None if isinstance(value, dict) else f"expected an object, got {shown(value)}"


def _texts(value: Any) -> str | None:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return None
    return f"expected an array of strings, got {shown(value)}"


def token_ids_problem(value: Any) -> str | None:
    """One token id, or an array of them (``eos_token_id`` often lists several)."""
    for item in value if isinstance(value, list) else [value]:
        problem = SHAPES.token_id.problem(item)
        if problem:
            return problem
    return None


def _factors(value: Any) -> str | None:
    """Longrope's per-dimension factors: an array of finite numbers > 0."""
    if not isinstance(value, list):
        return f"expected an array of numbers, got {shown(value)}"
    for i, item in enumerate(value):
        problem = SHAPES.rope_factor.problem(item)
        if problem:
            return f"[{i}]: {problem}"
    return None


# config.json key -> check of its value (absent or null keys take the reader's defaults).
CONFIG_KEYS: dict[str, Check] = {
    "model_type": _text,
    "num_hidden_layers": SHAPES.layers.problem,
    "hidden_size": SHAPES.hidden.problem,
    "intermediate_size": SHAPES.ffn.problem,
    "num_attention_heads": SHAPES.heads.problem,
    "num_key_value_heads": SHAPES.kv_heads.problem,
    "head_dim": SHAPES.head_size.problem,
    "vocab_size": SHAPES.vocab.problem,
    "max_position_embeddings": SHAPES.context.problem,
    "original_max_position_embeddings": SHAPES.original_context.problem,
    "rms_norm_eps": SHAPES.norm_eps.problem,
    "rope_theta": SHAPES.rope_base.problem,
    "rope_local_base_freq": SHAPES.rope_base.problem,
    "partial_rotary_factor": SHAPES.rotary_fraction.problem,
    "rope_scaling": _object,
    "rope_parameters": _object,
    "sliding_window": SHAPES.window.problem,
    "use_sliding_window": _flag,
    "max_window_layers": SHAPES.layer_number.problem,
    "sliding_window_pattern": SHAPES.layer_number.problem,
    "_sliding_window_pattern": SHAPES.layer_number.problem,
    "layer_types": _texts,
    "tie_word_embeddings": _flag,
    "final_logit_softcapping": SHAPES.softcap.problem,
    "attn_logit_softcapping": SHAPES.softcap.problem,
    "query_pre_attn_scalar": SHAPES.query_scalar.problem,
}
# A rope parameter set's key (``rope_scaling``, ``rope_parameters`` or one of its per-layer-type
# sets) -> check of its value.
ROPE_KEYS: dict[str, Check] = {
    "rope_type": _text,
    "type": _text,
    "rope_theta": SHAPES.rope_base.problem,
    "factor": SHAPES.rope_factor.problem,
    "low_freq_factor": SHAPES.rope_factor.problem,
    "high_freq_factor": SHAPES.rope_factor.problem,
    "original_max_position_embeddings": SHAPES.original_context.problem,
    "attention_factor": SHAPES.rope_factor.problem,
    "partial_rotary_factor": SHAPES.rotary_fraction.problem,
    "short_factor": _factors,
    "long_factor": _factors,
}
# Gemma 3 (transformers 5): one rope parameter set per layer type.
LAYER_TYPE_SETS = ("full_attention", "sliding_attention")
# The keys each rope type reads without a default (types not listed are refused by the reader).
ROPE_NEEDS: dict[str, tuple[str, ...]] = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor"),
    "su": ("short_factor", "long_factor"),
}


def check_config(path: Path, config: Mapping[str, Any]) -> None:
    """Every config.json value the reader uses: its type and range (``path``: the file)."""
    problems = _problems(config, CONFIG_KEYS, "")
    for where, params in rope_sets(config):
        if not isinstance(params, dict):
            problems.append(f"{where}: {_object(params)}")
            continue
        problems += _problems(params, ROPE_KEYS, f"{where}.")
        kind = rope_kind(params)
        for key in ROPE_NEEDS.get(str(kind), ()):
            if params.get(key) is None:
                problems.append(f"{where}.{key}: missing (rope type {kind!r} needs it)")
    if problems:
        raise ModelError(f"{path}: " + "; ".join(problems[:MAX_PROBLEMS]))


def value_or(doc: Mapping[str, Any], key: str, default: Any) -> Any:
    """``doc[key]``, or ``default`` when absent or null (transformers writes null for unset)."""
    value = doc.get(key)
    return default if value is None else value


def rope_kind(params: Mapping[str, Any]) -> Any:
    """A rope parameter set's type (``rope_type``, or the older ``type``)."""
    return value_or(params, "rope_type", value_or(params, "type", "default"))


def rope_sets(config: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(key path, value) of every rope parameter set config.json holds: ``rope_scaling``,
    ``rope_parameters``, and their per-layer-type sets (the reader looks for those in either)."""
    found: list[tuple[str, Any]] = []
    for key in ("rope_scaling", "rope_parameters"):
        params = config.get(key)
        if isinstance(params, dict):  # else CONFIG_KEYS names a set that is not an object
            found.append((key, params))
            found += [(f"{key}.{t}", params[t]) for t in LAYER_TYPE_SETS if t in params]
    return found


def _problems(doc: Mapping[str, Any], rules: Mapping[str, Check], prefix: str) -> list[str]:
    problems = []
    for key, rule in rules.items():
        value = doc.get(key)
        if value is not None:  # transformers writes null for "not set"
            problem = rule(value)
            if problem:
                problems.append(f"{prefix}{key}: {problem}")
    return problems


def check_factors(where: str, factors: list[Any], dim: int) -> None:
    """Longrope's factors: one per rotary frequency (``dim`` / 2)."""
    if len(factors) != dim // 2:
        raise ModelError(
            f"{where}: {len(factors)} factors, but {dim} rotary dimensions need {dim // 2}"
        )


def check_rope_dim(where: str, head_size: int, fraction: float) -> int:
    """The rotary dimensions of a head: an even number, at least 2."""
    dim = int(head_size * fraction)
    if dim < 2 or dim % 2:
        raise ModelError(
            f"{where}: head size {head_size} x partial_rotary_factor {fraction} gives {dim} "
            "rotary dimensions; expected an even number of at least 2"
        )
    return dim


def check_llama3(where: str, low: float, high: float) -> None:
    """Llama 3's smooth band lies between the two wavelength factors (the blend divides by
    their difference)."""
    if high <= low:
        raise ModelError(f"{where}: high_freq_factor {high} is not above low_freq_factor {low}")


def present(path: Path) -> bool:
    """Whether the folder has ``path``: False when absent, True for a regular file; a FIFO,
    device or folder under that name is refused before it is opened (reading it would block or
    never end)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: cannot be read ({exc})") from exc
    if not stat.S_ISREG(mode):
        raise ModelError(f"{path}: not a regular file ({_kind(mode)}); expected a file to read")
    return True


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"
