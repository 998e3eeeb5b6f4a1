"""Checks on a GGUF file's header and metadata, made before anything is allocated from them.

A GGUF file is untrusted input: its counts size the reader's loops, its hyper-parameters size
the graph (``context_length`` rows of rope tables, ``block_count`` layers), its ids index the
vocabulary. Every value the importer uses is checked here for its type and range; a failure is a
``ModelError`` naming the file and the key. The reader keeps only the metadata arrays the
importer reads (an unused 38 MiB array would otherwise cost ~10x its size as Python objects).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelError
from .bounds import SHAPES, Bound, is_int, shown

MAX_TENSORS = 1 << 16  # the largest real models have a few thousand
MAX_KEYS = 1 << 16
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ALIGNMENT = 1 << 16
# The shape bounds are shared with the Hugging Face import (bounds.SHAPES).
MAX_VOCAB = int(SHAPES.vocab.high)

# Metadata arrays the importer reads (by full key, or by the part after "{arch}."); the reader
# skips every other array without building it.
ARRAY_KEYS = frozenset(
    {
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.scores",
        "tokenizer.ggml.merges",
    }
)
ARCH_ARRAY_KEYS = frozenset({"attention.sliding_window_pattern"})


class SkippedArray:
    """An array the reader did not build (no importer code reads its key)."""

    def __init__(self, item_type: int, count: int):
        self.item_type, self.count = item_type, count

    def __repr__(self) -> str:
        return f"<skipped GGUF array: {self.count} items of type {self.item_type}>"


def keeps_array(key: str) -> bool:
    return key in ARRAY_KEYS or key.partition(".")[2] in ARCH_ARRAY_KEYS


def _fail(path: Path, message: str) -> ModelError:
    return ModelError(f"{path}: not a usable GGUF file: {message}")


def check_counts(path: Path, n_tensors: int, n_keys: int) -> None:
    if n_tensors > MAX_TENSORS:
        raise _fail(path, f"the header declares {n_tensors} tensors (at most {MAX_TENSORS})")
    if n_keys > MAX_KEYS:
        raise _fail(path, f"the header declares {n_keys} metadata keys (at most {MAX_KEYS})")


def alignment(path: Path, meta: Mapping[str, Any]) -> int:
    """``general.alignment`` (default 32): a power of two, a multiple of 8, at most 64 KiB."""
    value = meta.get("general.alignment", 32)
    ok = is_int(value) and 8 <= value <= MAX_ALIGNMENT and value & (value - 1) == 0
    if not ok:
        raise _fail(
            path,
            f"general.alignment is {shown(value)}; expected a power of two between 8 and "
            f"{MAX_ALIGNMENT} (tensor data would be read at wrong offsets)",
        )
    return int(value)


def check_tensor(
    path: Path, name: str, n_dims: int, dims: tuple[int, ...], offset: int, align: int
) -> None:
    """Shape and offset of one tensor info, before its size is computed."""
    if not 1 <= n_dims <= MAX_DIMS:
        raise _fail(path, f"tensor {name[:100]!r} has {n_dims} dimensions (1 to {MAX_DIMS})")
    if min(dims) < 1 or math.prod(dims) > 1 << 48:
        raise _fail(path, f"tensor {name!r} has shape {list(dims)}")
    if offset % align:
        raise _fail(path, f"tensor {name!r} starts at offset {offset}, not a multiple of {align}")


# -- metadata ---------------------------------------------------------------------------------


def _int(low: int, high: int) -> Callable[[Any], str | None]:
    return Bound(low, high).problem


def _text(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"expected a string, got {shown(value)}"
    return _utf8(value)


def _utf8(text: str) -> str | None:
    # The reader decodes with surrogateescape: a lone surrogate marks bytes that were not UTF-8.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"not valid UTF-8 at character {exc.start}"
    return None


def _flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"expected a boolean, got {shown(value)}"


def _pattern(value: Any) -> str | None:
    """Sliding-window layers: every Nth layer global, or one flag per layer."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "biu":
        return None
    return SHAPES.layer_number.problem(value)


# "{arch}.<suffix>" -> check of its value (absent keys take the reader's defaults).
ARCH_KEYS: dict[str, Callable[[Any], str | None]] = {
    "block_count": SHAPES.layers.problem,
    "context_length": SHAPES.context.problem,
    "embedding_length": SHAPES.hidden.problem,
    "feed_forward_length": SHAPES.ffn.problem,
    "attention.head_count": SHAPES.heads.problem,
    "attention.head_count_kv": SHAPES.kv_heads.problem,
    "attention.key_length": SHAPES.head_size.problem,
    "vocab_size": SHAPES.vocab.problem,
    "rope.dimension_count": SHAPES.rope_dim.problem,
    "rope.freq_base": SHAPES.rope_base.problem,
    "rope.scaling.type": _text,
    "rope.scaling.factor": SHAPES.rope_factor.problem,
    "rope.scaling.original_context_length": SHAPES.original_context.problem,
    "rope.scaling.attn_factor": SHAPES.rope_factor.problem,
    "attention.layer_norm_rms_epsilon": SHAPES.norm_eps.problem,
    "attention.sliding_window": SHAPES.window.problem,
    "attention.sliding_window_pattern": _pattern,
    "final_logit_softcapping": SHAPES.softcap.problem,
    "attn_logit_softcapping": SHAPES.softcap.problem,
}
TOKENIZER_KEYS: dict[str, Callable[[Any], str | None]] = {
    "tokenizer.ggml.model": _text,
    "tokenizer.ggml.pre": _text,
    "tokenizer.chat_template": _text,
    "tokenizer.ggml.add_bos_token": _flag,
    "tokenizer.ggml.add_eos_token": _flag,
    "tokenizer.ggml.add_space_prefix": _flag,
}
TOKEN_ID_KEYS = (
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
)


def check_metadata(path: Path, meta: Mapping[str, Any], arch: str, n_tensors: int) -> None:
    """Every metadata value the importer reads: type, range and agreement with the others."""
    problems = []

    def check(key: str, rule: Callable[[Any], str | None]) -> None:
        if key in meta:
            problem = rule(meta[key])
            if problem:
                problems.append(f"{key}: {problem}")

    for suffix, rule in ARCH_KEYS.items():
        check(f"{arch}.{suffix}", rule)
    for key, rule in TOKENIZER_KEYS.items():
        check(key, rule)
    if not problems:
        problems += _agreement(meta, arch, n_tensors)
    problems += _vocabulary(meta)
    if problems:
        raise _fail(path, "; ".join(problems[:6]))


def _agreement(meta: Mapping[str, Any], arch: str, n_tensors: int) -> list[str]:
    problems = []
    layers = meta.get(f"{arch}.block_count")
    if layers is not None and layers > n_tensors:  # each layer needs tensors of its own
        problems.append(f"{arch}.block_count: {layers} layers but only {n_tensors} tensors")
    heads = meta.get(f"{arch}.attention.head_count")
    kv_heads = meta.get(f"{arch}.attention.head_count_kv", heads)
    if heads is not None and kv_heads is not None and (kv_heads > heads or heads % kv_heads):
        problems.append(
            f"{arch}.attention.head_count_kv: {kv_heads} does not divide head_count {heads}"
        )
    hidden = meta.get(f"{arch}.embedding_length")
    head_size = meta.get(f"{arch}.attention.key_length")
    if head_size is None and hidden is not None and heads is not None and hidden % heads:
        problems.append(f"{arch}.embedding_length: {hidden} is not a multiple of {heads} heads")
    head_size = head_size or (hidden // heads if hidden and heads else None)
    rope = meta.get(f"{arch}.rope.dimension_count")
    if rope is not None and head_size is not None and (rope > head_size or rope % 2):
        problems.append(
            f"{arch}.rope.dimension_count: {rope}; expected an even number <= the head size "
            f"{head_size}"
        )
    window = meta.get(f"{arch}.attention.sliding_window")
    context = meta.get(f"{arch}.context_length")
    if window is not None and context is not None and window > context:
        problems.append(
            f"{arch}.attention.sliding_window: {window} is over the context length {context}"
        )
    return problems


def _vocabulary(meta: Mapping[str, Any]) -> list[str]:
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None:
        return []
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        return [f"tokenizer.ggml.tokens: expected an array of strings, got {shown(tokens)}"]
    problems = []
    count = len(tokens)
    if not 1 <= count <= MAX_VOCAB:
        problems.append(f"tokenizer.ggml.tokens: {count} tokens (1 to {MAX_VOCAB})")
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        items = meta.get(key, [])
        if not isinstance(items, list) or not all(isinstance(t, str) for t in items):
            problems.append(f"{key}: expected an array of strings, got {shown(items)}")
            continue
        for i, text in enumerate(items):
            problem = _utf8(text)
            if problem:
                problems.append(f"{key}[{i}]: {problem}")
                break
    for key, kinds in (("tokenizer.ggml.token_type", "iu"), ("tokenizer.ggml.scores", "iuf")):
        values = meta.get(key)
        if values is None:
            continue
        if not isinstance(values, np.ndarray) or values.dtype.kind not in kinds:
            problems.append(f"{key}: expected an array of numbers, got {shown(values)}")
        elif len(values) != count:
            problems.append(f"{key}: {len(values)} values for {count} tokens")
        elif values.dtype.kind == "f" and not np.isfinite(values).all():
            problems.append(f"{key}: holds a NaN or infinite score")
    for key in TOKEN_ID_KEYS:
        if key in meta:
            problem = _int(0, count - 1)(meta[key])
            if problem:
                problems.append(f"{key}: {problem} (the vocabulary has {count} tokens)")
    return problems
