"""Aggregate decode tokens/s of the server's slot backends: 1 stream vs N streams, batched
(one onnxruntime call per step for all rows) against interleaved (one call per row).

    python benchmarks/server_decode.py MODEL_DIR [--streams 4] [--tokens 64] [--rounds 3]

Rounds alternate the three setups so machine load hits them alike; the medians are printed
with the ratios against one stream. Greedy tokens of every stream are also compared with the
same backend's solo run (what the request gets alone on the server).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import genai_runtime as og
from genai_runtime.batching.slots import BatchedSlots, InterleavedSlots

PROMPTS = [
    "Once upon a time, in a land far away,",
    "The three most important inventions of the last century are",
    "def fibonacci(n):",
    "Write a short poem about the sea:",
    "The capital of France is",
    "In machine learning, overfitting means",
    "My favourite recipe for pancakes starts with",
    "The history of the printing press",
]


def decode(slots, prompts: list[np.ndarray], tokens: int) -> tuple[float, list[list[int]]]:
    """Prefill every stream, then time ``tokens`` greedy decode steps of all of them."""
    which = list(range(len(prompts)))
    out = [[int(np.argmax(slots.prefill(i, p, 0)))] for i, p in zip(which, prompts)]
    start = time.perf_counter()
    for _ in range(tokens):
        logits = slots.decode(which, np.array([o[-1] for o in out], np.int64))
        for o, row in zip(out, logits):
            o.append(int(np.argmax(row)))
    return len(which) * tokens / (time.perf_counter() - start), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    model = og.Model(args.model_dir)
    tok = og.Tokenizer(model)
    prompts = [np.asarray(tok.encode(p), np.int64) for p in PROMPTS[: args.streams]]
    context = 1024
    setups = {
        "1 stream": lambda: decode(InterleavedSlots(model, 1, context), prompts[:1], args.tokens),
        f"{args.streams} interleaved": lambda: decode(
            InterleavedSlots(model, args.streams, context), prompts, args.tokens
        ),
        f"{args.streams} batched": lambda: decode(
            BatchedSlots(model, args.streams, context), prompts, args.tokens
        ),
    }
    rates: dict[str, list[float]] = {k: [] for k in setups}
    outputs = {}
    for _ in range(args.rounds):
        for name, run in setups.items():
            rate, out = run()
            rates[name].append(rate)
            outputs[name] = out
    # Solo runs of each backend: what a request gets when it is alone on the server.
    solo = {
        "interleaved": [
            decode(InterleavedSlots(model, 1, context), [p], args.tokens)[1][0] for p in prompts
        ],
        "batched": [
            decode(BatchedSlots(model, args.streams, context), [p], args.tokens)[1][0]
            for p in prompts
        ],
    }
    base = statistics.median(rates["1 stream"])
    for name, values in rates.items():
        med = statistics.median(values)
        line = f"{name:>16}: {med:8.1f} tok/s aggregate  ({med / base:4.2f}x one stream)"
        if name != "1 stream":
            kind = name.split()[1]
            same = [o == s for o, s in zip(outputs[name], solo[kind])]
            line += f"  tokens == {kind} solo run: {same}"
        print(line)


if __name__ == "__main__":
    main()
