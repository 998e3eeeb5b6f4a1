"""Per-token mask cost of three constrained-decoding libraries on one real tokenizer.

Each library present in this interpreter (llguidance, outlines-core, xgrammar) compiles the same
JSON schema against the model folder's ``tokenizer.json``, then walks one fixed valid answer token
by token: compute the allowed-token mask, then commit the token. Reported: compile time and the
median / p95 mask time per token. Libraries that are not importable are reported as missing
(xgrammar needs torch, so run this a second time from an interpreter that has it, with xgrammar
on ``PYTHONPATH``).

    python benchmarks/constrained_libraries.py /work/shared/models/smollm2-135m-instruct-int4
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
ANSWER = '{"name": "Ada Lovelace, mathematician and writer", "age": 36}'


def _byte_decoder() -> dict[str, int]:
    # GPT-2's byte-level alphabet: printable bytes map to themselves, the rest shift past 255.
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return {c: b for b, c in zip(range(256), chars, strict=True)}


def _tokens(folder: Path) -> tuple[list[int], int, int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    eos = config["eos_token_id"]
    eos = eos[0] if isinstance(eos, list) else eos
    return tok.encode(ANSWER, add_special_tokens=False).ids, int(config["vocab_size"]), int(eos)


def bench_llguidance(folder: Path, ids: list[int], vocab: int, eos: int) -> dict:
    import llguidance
    import llguidance.numpy as lnp

    t0 = time.perf_counter()
    tokenizer = llguidance.LLTokenizer(
        (folder / "tokenizer.json").read_text(), n_vocab=vocab, eos_token=eos
    )
    t1 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    matcher = llguidance.LLMatcher(tokenizer, grammar)
    t2 = time.perf_counter()
    mask = lnp.allocate_token_bitmask(1, vocab)
    times = []
    for token in ids:
        s = time.perf_counter()
        lnp.fill_next_token_bitmask(matcher, mask)
        times.append(time.perf_counter() - s)
        assert (mask[0, token // 32] >> (token % 32)) & 1, "answer token masked out"
        assert matcher.consume_token(token), matcher.get_error()
    return {"tokenizer_s": t1 - t0, "compile_s": t2 - t1, "mask_s": times}


def bench_outlines_core(folder: Path, ids: list[int], vocab: int, eos: int) -> dict:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    t0 = time.perf_counter()
    raw = json.loads((folder / "tokenizer.json").read_text())
    decode = _byte_decoder()
    special = {t["content"] for t in raw.get("added_tokens", [])}
    entries: dict[bytes, list[int]] = {}
    for text, tid in raw["model"]["vocab"].items():
        if tid == eos or text in special:
            continue
        entries.setdefault(bytes(decode[c] for c in text), []).append(tid)
    vocabulary = Vocabulary(eos, entries)
    t1 = time.perf_counter()
    index = Index(build_regex_from_schema(json.dumps(SCHEMA)), vocabulary)
    guide = Guide(index)
    t2 = time.perf_counter()
    mask = np.zeros((vocab + 31) // 32, dtype=np.int32)
    times = []
    for token in ids:
        s = time.perf_counter()
        guide.write_mask_into(mask.ctypes.data, mask.size, mask.itemsize)
        times.append(time.perf_counter() - s)
        assert (mask[token // 32] >> (token % 32)) & 1, "answer token masked out"
        guide.advance(token)
    return {"tokenizer_s": t1 - t0, "compile_s": t2 - t1, "mask_s": times}


def bench_xgrammar(folder: Path, ids: list[int], vocab: int, eos: int) -> dict:
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    t0 = time.perf_counter()
    hf = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=[eos])
    compiler = xgr.GrammarCompiler(info)
    t1 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA))
    matcher = xgr.GrammarMatcher(compiled)
    t2 = time.perf_counter()
    mask = xgr.allocate_token_bitmask(1, vocab)
    times = []
    for token in ids:
        s = time.perf_counter()
        matcher.fill_next_token_bitmask(mask)
        times.append(time.perf_counter() - s)
        assert (int(mask[0, token // 32]) >> (token % 32)) & 1, "answer token masked out"
        assert matcher.accept_token(token)
    return {"tokenizer_s": t1 - t0, "compile_s": t2 - t1, "mask_s": times}


LIBRARIES = {
    "llguidance": bench_llguidance,
    "outlines-core": bench_outlines_core,
    "xgrammar": bench_xgrammar,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="model folder with tokenizer.json")
    parser.add_argument("--repeat", type=int, default=5, help="walks of the answer per library")
    args = parser.parse_args()
    ids, vocab, eos = _tokens(args.model)
    print(f"vocab {vocab}, answer {len(ids)} tokens: {ANSWER}")
    for name, bench in LIBRARIES.items():
        try:
            runs = [bench(args.model, ids, vocab, eos) for _ in range(args.repeat)]
        except ImportError as error:
            print(f"{name:14s} not importable here ({error})")
            continue
        masks = [t * 1e6 for run in runs for t in run["mask_s"]]
        print(
            f"{name:14s} tokenizer {statistics.median(r['tokenizer_s'] for r in runs):7.3f} s  "
            f"compile {statistics.median(r['compile_s'] for r in runs) * 1e3:8.1f} ms  "
            f"mask median {statistics.median(masks):8.1f} us  "
            f"p95 {np.percentile(masks, 95):8.1f} us  max {max(masks):8.1f} us"
        )


if __name__ == "__main__":
    main()
