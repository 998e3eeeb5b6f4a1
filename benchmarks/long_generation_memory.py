"""Peak RSS of one long generation: genai_runtime vs onnxruntime-genai, each in a fresh process.

For each length (default 2000 and 8000 generated tokens) and each round, a worker process per
runtime loads the model, appends a short prompt and generates exactly that many tokens (EOS is
suppressed with min_length = max_length), then reports its peak RSS (``ru_maxrss``), the RSS
right after loading, and the generated ids. The driver alternates which side runs first each
round and prints the medians and the ours/reference ratio.

    python benchmarks/long_generation_memory.py [MODEL_DIR] [--lengths 2000 8000] [--rounds 1]
        [--threads N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_MODEL = HERE.parents[1] / "shared" / "models" / "smollm2-135m-instruct-int4"
PROMPT_IDS = [1, 504, 3458, 282, 4649, 314]  # a short fixed prompt: the cache is what grows
SIDES = ("ours", "reference")


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def worker(side: str, model_dir: str, new_tokens: int, threads: int | None) -> dict[str, Any]:
    total = len(PROMPT_IDS) + new_tokens
    if side == "ours":
        import genai_runtime as og
    else:
        import onnxruntime_genai as og
    config = og.Config(model_dir)
    if threads:
        overlay = {"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}
        config.overlay(json.dumps(overlay))
    model = og.Model(config)
    loaded = _rss_mib()
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=total, min_length=total)
    generator = og.Generator(model, params)
    start = time.perf_counter()
    generator.append_tokens(PROMPT_IDS)
    while not generator.is_done():
        generator.generate_next_token()
    seconds = time.perf_counter() - start
    ids = [int(t) for t in generator.get_sequence(0)]
    return {
        "side": side,
        "new_tokens": len(ids) - len(PROMPT_IDS),
        "rss_after_load_mib": loaded,
        "rss_end_mib": _rss_mib(),
        "peak_rss_mib": _peak_mib(),
        "seconds": seconds,
        "ids": ids,
    }


def run_side(side: str, args: argparse.Namespace, new_tokens: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, str(args.model_dir), "--worker", side]
    cmd += ["--lengths", str(new_tokens)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir", nargs="?", default=str(DEFAULT_MODEL))
    parser.add_argument("--lengths", type=int, nargs="+", default=[2000, 8000])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.model_dir, args.lengths[0], args.threads)))
        return 0
    results: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for n in args.lengths:
        results[n] = {side: [] for side in SIDES}
        for r in range(args.rounds):
            order = SIDES if r % 2 == 0 else SIDES[::-1]
            for side in order:
                results[n][side].append(run_side(side, args, n))
        ours, ref = results[n]["ours"], results[n]["reference"]
        same = all(a["ids"] == b["ids"] for a, b in zip(ours, ref))
        peak_o = statistics.median(x["peak_rss_mib"] for x in ours)
        peak_r = statistics.median(x["peak_rss_mib"] for x in ref)
        load_o = statistics.median(x["rss_after_load_mib"] for x in ours)
        load_r = statistics.median(x["rss_after_load_mib"] for x in ref)
        print(
            f"{n} new tokens: peak RSS ours {peak_o:.0f} MiB, reference {peak_r:.0f} MiB "
            f"(ratio {peak_o / peak_r:.3f}); after load ours {load_o:.0f}, reference "
            f"{load_r:.0f}; growth ours {peak_o - load_o:.0f}, reference {peak_r - load_r:.0f} "
            f"MiB; identical tokens: {same}"
        )
    if args.json:
        for per_side in results.values():
            for runs in per_side.values():
                for run in runs:
                    run.pop("ids")
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
