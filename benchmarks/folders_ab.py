"""Decode and prefill speed of two or more model folders of the same model, in one process.

    python benchmarks/folders_ab.py BASELINE_DIR OTHER_DIR [...] [--threads 2] [--rounds 7]
        [--new-tokens 64] [--prompt TEXT]

E.g. the same GGUF imported with different settings:

    genai-runtime import SmolLM2-135M-Instruct.Q4_1.gguf old --quant int4 --accuracy-level 0
    genai-runtime import SmolLM2-135M-Instruct.Q4_1.gguf new          # the default
    python benchmarks/folders_ab.py old new

Every folder generates the same chat-templated prompt greedily (exactly ``--new-tokens`` tokens,
EOS ignored) at the same intra-op thread count; the order rotates every round so a busy
machine's load falls on each alike. Prints each folder's median tok/s and the per-round ratios
against the first folder (median, min, max).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import genai_runtime as og  # noqa: E402


def load(folder: str, threads: int) -> og.Model:
    config = og.Config(folder)
    session = {"intra_op_num_threads": threads}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": session}}}))
    return og.Model(config)


def run(model: og.Model, ids: list[int], new: int) -> tuple[float, float]:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new, min_length=len(ids) + new)
    gen = og.Generator(model, params)
    t0 = time.perf_counter()
    gen.append_tokens(ids)
    t1 = time.perf_counter()
    while not gen.is_done():
        gen.generate_next_token()
    t2 = time.perf_counter()
    return len(ids) / (t1 - t0), (new - 1) / (t2 - t1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt", default="What is the capital of France?")
    args = ap.parse_args()
    models = [load(f, args.threads) for f in args.folders]
    tok = og.Tokenizer(models[0])
    text = tok.apply_chat_template(
        json.dumps([{"role": "user", "content": args.prompt}]), add_generation_prompt=True
    )
    ids = [int(i) for i in tok.encode(text)]
    for m in models:  # warm-up
        run(m, ids, 4)
    results: list[list[tuple[float, float]]] = [[] for _ in models]
    for r in range(args.rounds):
        order = list(range(len(models)))
        order = order[r % len(order) :] + order[: r % len(order)]
        for i in order:
            results[i].append(run(models[i], ids, args.new_tokens))
    print(f"{len(ids)} prompt tokens, {args.new_tokens} new, {args.threads} thread(s), "
          f"{args.rounds} rounds (order rotating)")  # fmt: skip
    for i, folder in enumerate(args.folders):
        prefill = statistics.median(p for p, _ in results[i])
        decode = statistics.median(d for _, d in results[i])
        line = f"  {folder}: prefill {prefill:.1f} tok/s, decode {decode:.1f} tok/s"
        if i:
            for k, name in ((1, "decode"), (0, "prefill")):
                ratios = [a[k] / b[k] for a, b in zip(results[i], results[0])]
                line += (f"; {name} x{statistics.median(ratios):.2f} "
                         f"({min(ratios):.2f}-{max(ratios):.2f})")  # fmt: skip
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
