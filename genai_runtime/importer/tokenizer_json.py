"""``tokenizer.json`` / ``tokenizer_config.json`` from a GGUF vocabulary (``tokenizer.ggml.*``).

GGUF keeps the byte-level BPE pieces and merges as the original tokenizer had them, plus a
pre-tokenizer *name* (``tokenizer.ggml.pre``); ``PRE_TOKENIZERS`` maps each supported name to the
splitting rule the original tokenizer used. Control tokens become special added tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ModelError, UnsupportedError
from .gguf_file import Vocab
from .tokenizer_parts import CONTROL, USER_DEFINED, added_token
from .tokenizer_spm import spm_tokenizer_json

_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
# The llama-3 / tiktoken-style split, then byte-level mapping without GPT-2's own regex.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2's split: as llama-3's, but digits one at a time.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _split_then_bytes(pattern: str) -> dict[str, Any]:
    return {
        "type": "Sequence",
        "pretokenizers": [
            {
                "type": "Split",
                "pattern": {"Regex": pattern},
                "behavior": "Isolated",
                "invert": False,
            },
            {**_BYTE_LEVEL, "use_regex": False},
        ],
    }


# tokenizer.ggml.pre -> the pre_tokenizer block of tokenizer.json.
PRE_TOKENIZERS: dict[str, dict[str, Any]] = {
    "gpt-2": {**_BYTE_LEVEL, "use_regex": True},
    "smollm": {**_BYTE_LEVEL, "use_regex": True},
    "llama-bpe": _split_then_bytes(_LLAMA3_SPLIT),
    "qwen2": _split_then_bytes(_QWEN2_SPLIT),
}
# tokenizer.ggml.pre -> a normalizer the original tokenizer runs first (others have none).
NORMALIZERS: dict[str, dict[str, Any]] = {"qwen2": {"type": "NFC"}}


def tokenizer_json(vocab: Vocab, source: str) -> dict[str, Any]:
    """The tokenizers-library document for the GGUF vocabulary (by ``tokenizer.ggml.model``)."""
    if vocab.model not in TOKENIZER_MODELS:
        raise UnsupportedError(
            f"{source}: GGUF tokenizer model {vocab.model!r} is not supported; "
            f"supported: {', '.join(TOKENIZER_MODELS)}"
        )
    return TOKENIZER_MODELS[vocab.model](vocab, source)


def byte_level_bpe_json(vocab: Vocab, source: str) -> dict[str, Any]:
    """The document for a byte-level BPE vocabulary (``gpt2``: pieces and merges as stored)."""
    if vocab.pre not in PRE_TOKENIZERS:
        raise UnsupportedError(
            f"{source}: GGUF pre-tokenizer {vocab.pre!r} is not supported; "
            f"supported: {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    ids = {tok: i for i, tok in enumerate(vocab.tokens)}
    merges = [_merge(m, i, ids, source) for i, m in enumerate(vocab.merges)]
    added = [
        added_token(i, tok, kind)
        for i, (tok, kind) in enumerate(zip(vocab.tokens, vocab.token_types))
        if kind in (CONTROL, USER_DEFINED)
    ]
    single: list[dict[str, Any]] = [{"Sequence": {"id": "A", "type_id": 0}}]
    special: dict[str, Any] = {}
    if vocab.add_bos and vocab.bos_id is not None:
        single.insert(0, _special(vocab, vocab.bos_id, special))
    if vocab.add_eos and vocab.eos_id is not None:
        single.append(_special(vocab, vocab.eos_id, special))
    second = [
        {"Sequence": {"id": "B", "type_id": 1}} if "Sequence" in part else part for part in single
    ]
    post = {
        "type": "TemplateProcessing",
        "single": single,
        "pair": single + second,
        "special_tokens": special,
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": NORMALIZERS.get(vocab.pre),
        "pre_tokenizer": PRE_TOKENIZERS[vocab.pre],
        "post_processor": post if special else None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": ids,
            "merges": merges,
        },
    }


def _merge(merge: str, i: int, ids: dict[str, int], source: str) -> list[str]:
    """One merge rule as ``[left, right]``; a rule naming a piece the vocabulary lacks is a
    ``ModelError`` here, at import (the tokenizer would refuse to load only at ``run``)."""
    left, space, right = merge.partition(" ")
    missing = next((p for p in (left, right, left + right) if p not in ids), None)
    if not space or not left or not right or missing is not None:
        why = (
            f"names {missing!r}, which is not in the vocabulary"
            if space and left and right
            else "is not two pieces apart by one space"
        )
        raise ModelError(f"{source}: tokenizer.ggml.merges[{i}] {merge[:60]!r} {why}")
    return [left, right]


# tokenizer.ggml.model -> its writer; "llama" is SentencePiece-style (tokenizer_spm.py).
TOKENIZER_MODELS: dict[str, Callable[[Vocab, str], dict[str, Any]]] = {
    "gpt2": byte_level_bpe_json,
    "llama": spm_tokenizer_json,
}


def _special(vocab: Vocab, tid: int, special: dict[str, Any]) -> dict[str, Any]:
    tok = vocab.tokens[tid]
    special[tok] = {"id": tok, "ids": [tid], "tokens": [tok]}
    return {"SpecialToken": {"id": tok, "type_id": 0}}


def tokenizer_config(vocab: Vocab, context_length: int) -> dict[str, Any]:
    """tokenizer_config.json: special tokens by text, BOS/EOS rules and the chat template."""

    def text(tid: int | None) -> str | None:
        return vocab.tokens[tid] if tid is not None and 0 <= tid < len(vocab.tokens) else None

    cfg: dict[str, Any] = {
        "add_bos_token": vocab.add_bos,
        "add_eos_token": vocab.add_eos,
        "bos_token": text(vocab.bos_id),
        "eos_token": text(vocab.eos_id),
        "pad_token": text(vocab.pad_id),
        "unk_token": text(vocab.unk_id),
        "model_max_length": context_length,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if vocab.chat_template:
        cfg["chat_template"] = vocab.chat_template
    return {k: v for k, v in cfg.items() if v is not None}
