"""``tokenizer.json`` for a SentencePiece-style GGUF vocabulary (``tokenizer.ggml.model`` "llama").

Such a GGUF stores pieces with ``▁`` for spaces, scores, token types and ``<0x..>`` byte tokens,
but no merges. The document written here is the form transformers gives these vocabularies (BPE
with byte fallback, spaces replaced by ``▁``): for Gemma (``tokenizer.ggml.add_space_prefix``
false) as it is; for Phi-3 / Llama (the default, true) with a ``▁`` prepended to each text run
by the normalizer and stripped again on decode. Encodings match the tokenizer the reference
builder exports:

- merges are rebuilt from the vocabulary: every split of a piece into two pieces that are both
  in the vocabulary, ranked by the merged piece's position in the file (earlier = merged first;
  Gemma's scores do not follow its merge order, its file order does), then by longer left, longer
  right piece, and within one piece by the ids of its parts;
- a piece made only of spaces is stored with real spaces in the GGUF; it is spelled with ``▁`` here,
  as the normalizer produces them;
- control tokens are special added tokens; user-defined ones (e.g. ``\\n\\n``, ``<table>``) are
  added tokens matched whole, unless they are space runs (those are ordinary pieces).
"""

from __future__ import annotations

from typing import Any

from ..errors import ModelError
from .gguf_file import Vocab
from .tokenizer_parts import CONTROL, USER_DEFINED, added_token

SPACE = "\u2581"


def _spell(token: str) -> str:
    return SPACE * len(token) if " " in token and not token.strip() else token


def spm_merges(tokens: list[str]) -> list[list[str]]:
    """BPE merges implied by a SentencePiece vocabulary in file order (see the module doc)."""
    vocab = {t: i for i, t in enumerate(tokens)}  # a repeated piece keeps its last id
    ranked = []
    for piece, pid in vocab.items():
        local = []
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            lid, rid = vocab.get(left), vocab.get(right)
            if lid is not None and rid is not None:
                local.append((lid, rid, left, right))
        local.sort()
        ranked.extend((pid, -len(left), -len(right), left, right) for _, _, left, right in local)
    # Stable sort: ties keep the order above (piece order, then part ids).
    ranked.sort(key=lambda m: m[:3])
    return [[left, right] for *_, left, right in ranked]


def spm_tokenizer_json(vocab: Vocab, source: str) -> dict[str, Any]:
    """The tokenizers-library document for a SentencePiece-style GGUF vocabulary."""
    tokens = [_spell(t) for t in vocab.tokens]
    for key, tid in (("bos", vocab.bos_id), ("eos", vocab.eos_id), ("unknown", vocab.unk_id)):
        if tid is not None and not 0 <= tid < len(tokens):
            raise ModelError(
                f"{source}: tokenizer.ggml.{key}_token_id is {tid}, outside the vocabulary of "
                f"{len(tokens)} tokens"
            )
    added = [
        added_token(i, tok, kind)
        for i, (tok, orig, kind) in enumerate(zip(tokens, vocab.tokens, vocab.token_types))
        if kind == CONTROL or (kind == USER_DEFINED and tok == orig)
    ]
    single: list[dict[str, Any]] = [{"Sequence": {"id": "A", "type_id": 0}}]
    pair: list[dict[str, Any]] = [{"Sequence": {"id": "B", "type_id": 1}}]
    special: dict[str, Any] = {}
    for flag, tid, at_end in (
        (vocab.add_bos, vocab.bos_id, False),
        (vocab.add_eos, vocab.eos_id, True),
    ):
        if not flag or tid is None:
            continue
        tok = tokens[tid]
        special[tok] = {"id": tok, "ids": [tid], "tokens": [tok]}
        for seq, type_id in ((single, 0), (pair, 1)):
            part = {"SpecialToken": {"id": tok, "type_id": type_id}}
            seq.append(part) if at_end else seq.insert(0, part)
    post = {
        "type": "TemplateProcessing",
        "single": single,
        "pair": single + pair,
        "special_tokens": special,
    }
    unk = tokens[vocab.unk_id] if vocab.unk_id is not None else None
    spaces = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
    decoders: list[dict[str, Any]] = [
        {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if vocab.add_space_prefix:  # Phi-3 / Llama: "▁" before each text run, dropped on decode
        normalizer: dict[str, Any] = {
            "type": "Sequence",
            "normalizers": [{"type": "Prepend", "prepend": SPACE}, spaces],
        }
        pre_tokenizer = None
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    else:  # Gemma
        normalizer = spaces
        pre_tokenizer = {
            "type": "Split",
            "pattern": {"String": " "},
            "behavior": "MergedWithPrevious",
            "invert": False,
        }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post if special else None,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": unk,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "merges": spm_merges(tokens),
        },
    }
