"""A/B candidate session settings for genai_runtime, each alone, in one process.

Loads the reference (onnxruntime-genai), ours with the config's settings ("baseline") and ours
with each candidate overlay, all at the same intra-op thread count, then runs greedy
generations round-robin (the order rotates each round) and prints, per variant, the median and
range of the per-round ratios against the reference and against our baseline. Sharing one
process and alternating generation by generation keeps the load of a busy machine roughly equal
for every variant, which separate processes minutes apart do not.

    python benchmarks/settings_ab.py [MODEL_DIR] [--threads 2] [--rounds 8] [--new-tokens 64]
        [--candidate NAME=JSON ...]

Without ``--candidate`` it tries the settings onnxruntime-genai could differ on (see
benchmarks/README.md): thread spinning off, the CPU memory arena off, memory patterns off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_MODEL = HERE.parents[1] / "shared" / "models" / "smollm2-135m-instruct-int4"
QUESTION = "What is the capital of France?"


def _options(entries: dict[str, Any]) -> str:
    return json.dumps({"model": {"decoder": {"session_options": entries}}})


CANDIDATES = {
    "no-spinning": _options({"session.intra_op.allow_spinning": "0"}),
    "no-arena": _options({"enable_cpu_mem_arena": False}),
    "no-mem-pattern": _options({"enable_mem_pattern": False}),
}


def make_runner(og: Any, model_dir: str, threads: int, overlays: list[str], ids: np.ndarray,
                new_tokens: int) -> Callable[[], tuple[float, float, list[int]]]:  # fmt: skip
    config = og.Config(model_dir)
    config.overlay(_options({"intra_op_num_threads": threads}))
    for overlay in overlays:
        config.overlay(overlay)
    model = og.Model(config)
    length = len(ids) + new_tokens

    def run() -> tuple[float, float, list[int]]:
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=length, min_length=length)
        generator = og.Generator(model, params)
        t0 = time.perf_counter()
        generator.append_tokens(ids)
        t1 = time.perf_counter()
        for _ in range(new_tokens):
            generator.generate_next_token()
        t2 = time.perf_counter()
        return len(ids) / (t1 - t0), new_tokens / (t2 - t1), generator.get_sequence(0).tolist()

    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", nargs="?", default=str(DEFAULT_MODEL))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument(
        "--candidate", action="append", default=[], metavar="NAME=JSON",
        help="a genai_config overlay to try on ours (repeatable; default: the built-in list)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    candidates = dict(c.split("=", 1) for c in args.candidate) if args.candidate else CANDIDATES

    import onnxruntime_genai as reference

    import genai_runtime

    tokenizer = reference.Tokenizer(reference.Model(args.model_dir))
    messages = json.dumps([{"role": "user", "content": QUESTION}])
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = np.asarray(tokenizer.encode(text), dtype=np.int32)
    make = (args.model_dir, args.threads)
    runners = {"reference": make_runner(reference, *make, [], ids, args.new_tokens)}
    runners["baseline"] = make_runner(genai_runtime, *make, [], ids, args.new_tokens)
    for name, overlay in candidates.items():
        runners[name] = make_runner(genai_runtime, *make, [overlay], ids, args.new_tokens)
    names = list(runners)
    for run in runners.values():  # warm-up: first-run costs stay out
        run()
    results: dict[str, list[tuple[float, float, list[int]]]] = {n: [] for n in names}
    for i in range(args.rounds):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            results[name].append(runners[name]())
    print(
        f"{args.model_dir} | {len(ids)} prompt tokens, {args.new_tokens} new | "
        f"intra_op_num_threads={args.threads} | {args.rounds} rounds, one process"
    )
    ref_tokens = results["reference"][0][2]
    for name in names[1:]:
        same = all(r[2] == ref_tokens for r in results[name])
        cells = []
        for against in ("reference", "baseline"):
            if against == name:
                continue
            for k, label in ((0, "prefill"), (1, "decode")):
                ratios = [a[k] / b[k] for a, b in zip(results[name], results[against])]
                cells.append(
                    f"{label}/{against} {statistics.median(ratios):.3f} "
                    f"({min(ratios):.3f}..{max(ratios):.3f})"
                )
        print(f"{name:16s} " + "  ".join(cells) + f"  same tokens: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
