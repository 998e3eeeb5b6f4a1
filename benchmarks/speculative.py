"""Speculative decoding on the real SmolLM2 int4: parity with plain greedy, and speed.

    python benchmarks/speculative.py parity [--new-tokens 64]
    python benchmarks/speculative.py speed  [--rounds 3] [--new-tokens 128]

``parity`` decodes 10 chat prompts with plain greedy, with the 2-layer draft model and with
n-gram prompt lookup, and lists every first departure from plain greedy with the plain run's
logit margin between the two tokens at that position (a near-tie when < 0.05).
``speed`` times decode tok/s of plain greedy, n-gram and draft-model speculation on
input-grounded prompts (repeat / correct / summarise a given passage), the three modes
alternating inside every round, and prints the per-round ratios' medians and acceptance stats.
Models: ``../shared/models/smollm2-135m-instruct-int4`` (target) and its ``-2layers`` export.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import genai_runtime as og

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "models"
TARGET = SHARED / "smollm2-135m-instruct-int4"
DRAFT = "../smollm2-135m-instruct-int4-2layers/model.onnx"

PASSAGE = (
    "The Great Barrier Reef is the world's largest coral reef system, composed of over 2,900 "
    "individual reefs and 900 islands stretching for over 2,300 kilometres over an area of "
    "approximately 344,400 square kilometres. The reef is located in the Coral Sea, off the coast "
    "of Queensland, Australia. It can be seen from outer space and is the world's biggest single "
    "structure made by living organisms."
)
TYPOS = (
    "Their are many reasons why people enjoy reading books. Books can transport you too another "
    "world, teach you new skills, and help you relax after a long day. Many people reads before "
    "bed because it helps them fall asleep."
)
CODE = (
    "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n"
    "    return total / len(values)\n"
)
GROUNDED = [
    f"Repeat the following passage exactly, word for word:\n\n{PASSAGE}",
    f"Correct the spelling and grammar mistakes in this text and return the corrected text:\n\n"
    f"{TYPOS}",
    f"Summarise this passage in two sentences, reusing its wording:\n\n{PASSAGE}",
    f"Rewrite this Python function with a docstring, keeping the code the same:\n\n{CODE}",
    f"Copy this text and put every sentence on its own line:\n\n{TYPOS}",
]
PARITY = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in one paragraph.",
    "List three uses of copper.",
    "How do I reverse a list in Python?",
    *GROUNDED,
]


FP32_COMPUTE = {"model": {"decoder": {"session_options": {"mlas.qnbit.force_fp32": "1"}}}}


def model(mode: str, k: int, fp32_compute: bool = False, margin: float = 0.0) -> og.Model:
    config = og.Config(TARGET, root=SHARED)
    if fp32_compute:  # MatMulNBits computes in fp32 for one row and for several alike
        config.overlay(json.dumps(FP32_COMPUTE))
    if mode == "draft":
        config.overlay(json.dumps({
            "model": {"draft": {"filename": DRAFT}},
            "speculative": {"max_draft_tokens": k, "verify_margin": margin},
        }))  # fmt: skip
    elif mode == "ngram":
        config.overlay(
            json.dumps(
                {
                    "speculative": {
                        "ngram_size": 3,
                        "max_draft_tokens": k,
                        "verify_margin": margin,
                    }
                }
            )
        )
    return og.Model(config)


def prompt_ids(tokenizer, text: str) -> np.ndarray:
    """Chat-templated ids; ``tokenizer`` is ours or onnxruntime-genai's (a JSON string for it)."""
    messages = json.dumps([{"role": "user", "content": text}])
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def decode(m, ids: np.ndarray, new_tokens: int, rows: list | None = None, api=og):
    """Greedy decode on ``m`` (a model of ``api``: genai_runtime or onnxruntime_genai): the new
    tokens, decode tok/s after the prompt pass, speculative stats (ours) and prompt seconds."""
    params = api.GeneratorParams(m)
    params.set_search_options(max_length=len(ids) + new_tokens, do_sample=False)
    gen = api.Generator(m, params)
    t0 = time.perf_counter()
    gen.append_tokens(ids)
    t1 = time.perf_counter()
    while not gen.is_done():
        if rows is not None:
            rows.append(gen.get_logits()[0, 0].copy())
        gen.generate_next_token()
    t2 = time.perf_counter()
    out = gen.get_sequence(0)[len(ids) :]
    stats = gen.get_speculative_stats() if getattr(m, "speculative", None) is not None else None
    return out, (len(out) - 1) / (t2 - t1) if len(out) > 1 else 0.0, stats, t1 - t0


def parity(args) -> int:
    models = {
        mode: model(mode, args.k, args.fp32_compute, args.verify_margin)
        for mode in ("plain", "draft", "ngram")
    }
    tokenizer = og.Tokenizer(models["plain"])
    worst = 0.0
    for i, text in enumerate(PARITY):
        ids = prompt_ids(tokenizer, text)
        rows: list = []
        plain, *_ = decode(models["plain"], ids, args.new_tokens, rows)
        for mode in ("draft", "ngram"):
            out, _, stats, _ = decode(models[mode], ids, args.new_tokens)
            n = min(len(out), len(plain))
            differ = np.flatnonzero(out[:n] != plain[:n])
            rate = stats["acceptance_rate"]
            if differ.size == 0 and len(out) == len(plain):
                print(f"prompt {i} {mode:5s}: identical ({len(out)} tokens, acceptance {rate:.2f})")
                continue
            j = int(differ[0]) if differ.size else n
            row = rows[j]
            a = int(np.argmax(row))  # plain greedy's choice there (its EOS when it ended)
            b = int(out[j]) if j < len(out) else models[mode].spec.tokens.eos[0]
            margin = float(row[a] - row[b])
            worst = max(worst, margin)
            print(
                f"prompt {i} {mode:5s}: departs at generated token {j}: plain {a} vs {b}, "
                f"plain-run logit margin {margin:.4f} (acceptance {rate:.2f})"
            )
    print(f"largest departure margin: {worst:.4f} (must be < 0.05)")
    return 0 if worst < 0.05 else 1


def speed(args) -> int:
    modes = ("plain", "ngram", "draft")
    models = {mode: model(mode, args.k, args.fp32_compute, args.verify_margin) for mode in modes}
    tokenizer = og.Tokenizer(models["plain"])
    prompts = [prompt_ids(tokenizer, t) for t in GROUNDED]
    ratios: dict[str, list[float]] = {"ngram": [], "draft": []}
    totals = {m: [0.0, 0] for m in modes}
    accept = {"ngram": [0, 0, 0], "draft": [0, 0, 0]}
    agree = {"ngram": 0, "draft": 0}
    for r in range(args.rounds):
        for ids in prompts:
            tps, outs = {}, {}
            for mode in modes if r % 2 == 0 else reversed(modes):
                out, rate, stats, _ = decode(models[mode], ids, args.new_tokens)
                tps[mode], outs[mode] = rate, out
                totals[mode][0] += rate
                totals[mode][1] += 1
                if stats:
                    a = accept[mode]
                    a[0] += stats["proposed"]
                    a[1] += stats["accepted"]
                    a[2] += stats["rounds"]
            for mode in ("ngram", "draft"):
                ratios[mode].append(tps[mode] / tps["plain"])
                agree[mode] += bool(np.array_equal(outs[mode], outs["plain"]))
    runs = args.rounds * len(prompts)
    print(f"{len(prompts)} input-grounded prompts x {args.rounds} rounds, {args.new_tokens} new "
          f"tokens, modes alternating (ratios per run; tok/s move with load)")  # fmt: skip
    for mode in modes:
        print(f"  {mode:5s} decode tok/s mean {totals[mode][0] / totals[mode][1]:.1f}")
    for mode in ("ngram", "draft"):
        p, a, n = accept[mode]
        print(
            f"  {mode} / plain decode tok/s: median {statistics.median(ratios[mode]):.2f} "
            f"(min {min(ratios[mode]):.2f}, max {max(ratios[mode]):.2f}); acceptance "
            f"{a / max(p, 1):.2f} ({a}/{p}), {(a + n) / max(n, 1):.2f} tokens per target pass; "
            f"identical to plain greedy in {agree[mode]}/{runs} runs"
        )
    return 0


def reference_speed(args) -> None:
    """onnxruntime-genai's own n-gram mode (its v1 ``speculative`` block, on a linked copy of
    the target folder) against its own plain greedy, on the same prompts, alternating."""
    import tempfile

    import onnxruntime_genai as rg

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ngram"
        folder.mkdir()
        for f in TARGET.iterdir():
            if f.name != "genai_config.json":
                (folder / f.name).symlink_to(f)
        doc = json.loads((TARGET / "genai_config.json").read_text())
        doc["speculative"] = {"ngram_size": 3, "max_draft_tokens": args.k}
        (folder / "genai_config.json").write_text(json.dumps(doc))
        models = {"plain": rg.Model(str(TARGET)), "ngram": rg.Model(str(folder))}
        tokenizer = rg.Tokenizer(models["plain"])
        prompts = [prompt_ids(tokenizer, t) for t in GROUNDED]
        ratios, agree, totals = [], 0, {"plain": 0.0, "ngram": 0.0}
        for r in range(args.rounds):
            for ids in prompts:
                tps, outs = {}, {}
                for mode in ("plain", "ngram") if r % 2 == 0 else ("ngram", "plain"):
                    outs[mode], tps[mode], *_ = decode(models[mode], ids, args.new_tokens, api=rg)
                    totals[mode] += tps[mode]
                ratios.append(tps["ngram"] / tps["plain"])
                agree += bool(np.array_equal(outs["ngram"], outs["plain"]))
        runs = len(ratios)
        print(
            f"  onnxruntime-genai: plain {totals['plain'] / runs:.1f} tok/s, n-gram "
            f"{totals['ngram'] / runs:.1f} tok/s; n-gram / plain median "
            f"{statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f}); "
            f"identical to its plain greedy in {agree}/{runs} runs"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("parity", "speed"))
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-k", type=int, default=8, help="max draft tokens per round")
    parser.add_argument(
        "--fp32-compute",
        action="store_true",
        help="session option mlas.qnbit.force_fp32=1 on the target (plain and speculative)",
    )
    parser.add_argument(
        "--verify-margin",
        type=float,
        default=0.0,
        help="re-decide batched greedy near-ties (top-2 margin below this) one token at a time",
    )
    parser.add_argument(
        "--reference",
        action="store_true",
        help="speed: also time onnxruntime-genai's n-gram mode against its plain greedy",
    )
    args = parser.parse_args(argv)
    if args.new_tokens is None:
        args.new_tokens = 64 if args.what == "parity" else 128
    if args.what == "parity":
        return parity(args)
    code = speed(args)
    if args.reference:
        reference_speed(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
