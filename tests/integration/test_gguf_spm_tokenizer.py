"""A Phi-3 / Llama-style SentencePiece vocabulary (``tokenizer.ggml.model`` "llama", space
prefix on) from GGUF metadata, against an independent SentencePiece-BPE tokenizer written here:
prefix "▁", spaces as "▁", then repeatedly merge the adjacent pair whose concatenation has the
best score (leftmost on ties), unknown characters as UTF-8 byte tokens — llama.cpp's algorithm.
"""

from __future__ import annotations

import json
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest
from varied_strings import varied_strings

from genai_runtime.importer.gguf_file import read_gguf, vocab_from_metadata
from genai_runtime.importer.tokenizer_json import tokenizer_json

gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")

SPACE = "\u2581"
SPECIALS = ["<unk>", "<s>", "</s>"]
ADDED = ["<|user|>", "<|end|>", "<|assistant|>"]
CORPUS = [
    "the theory of the thing is that the thin ant thinks",
    "Привет мир, привет всем. Ça va très bien, merci.",
    "def main(): return the_answer(42)  # hello world",
    "東京は日本の首都です。 東京タワー",
]


def train_pieces(merges: int = 80) -> list[str]:
    """Single characters of the corpus (spaces as ▁), then the pieces of ``merges`` greedy
    most-frequent-pair merges, in merge order (a small SentencePiece-BPE vocabulary)."""
    words = [list(SPACE + w) for text in CORPUS for w in text.split(" ")]
    pieces = sorted({c for w in words for c in w})
    for _ in range(merges):
        pairs = Counter(pair for w in words for pair in pairwise(w))
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        pieces.append(a + b)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == (a, b):
                    w[i : i + 2] = [a + b]
                i += 1
    return list(dict.fromkeys(pieces))


def write_spm_gguf(path: Path) -> tuple[list[str], dict[str, float]]:
    tokens = SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + train_pieces() + ADDED
    types = [2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259 - len(ADDED)) + [4] * len(ADDED)
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    w = gguf.GGUFWriter(str(path), "phi3")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tokens, {t: s for t, s in zip(tokens, scores) if not t.startswith("<")}


def spm_encode(text: str, ids: dict[str, int], scores: dict[str, float]) -> list[int]:
    """The reference: llama.cpp-style SentencePiece BPE over one run of text."""
    symbols = list(SPACE + text.replace(" ", SPACE))
    while True:
        best = None
        for i in range(len(symbols) - 1):
            piece = symbols[i] + symbols[i + 1]
            if piece in scores and (best is None or scores[piece] > scores[best[1]]):
                best = (i, piece)
        if best is None:
            break
        i, piece = best
        symbols[i : i + 2] = [piece]
    out = []
    for s in symbols:
        if s in ids:
            out.append(ids[s])
        else:
            out.extend(ids[f"<0x{b:02X}>"] for b in s.encode("utf-8"))
    return out


def test_phi3_style_spm_vocabulary_encodes_as_sentencepiece(tmp_path):
    tokens, scores = write_spm_gguf(tmp_path / "spm.gguf")
    ids = {t: i for i, t in enumerate(tokens)}
    fields, _ = read_gguf(tmp_path / "spm.gguf")  # the tokenizer metadata alone (no tensors)
    doc = tokenizer_json(vocab_from_metadata(fields, tmp_path / "spm.gguf"), "spm.gguf")
    ours = tokenizers.Tokenizer.from_str(json.dumps(doc))
    sample = [*CORPUS, "the  thing", " leading space", "ünïcödé 🙂 ok", *varied_strings(200)]
    checked = 0
    for s in sample:
        if any(a in s for a in ADDED):
            continue
        assert ours.encode(s).ids == spm_encode(s, ids, scores), s
        assert ours.decode(ours.encode(s).ids) == s, s
        checked += 1
    assert checked > 150
    # Added (user-defined) tokens are matched whole; the text after one gets its own "▁".
    got = ours.encode("<|user|>the thing<|end|>").ids
    assert got[0] == ids["<|user|>"] and got[-1] == ids["<|end|>"]
    assert got[1:-1] == spm_encode("the thing", ids, scores)
