"""Whole-process model load time: ours against onnxruntime-genai, alternating fresh processes.

Each run is ``python -c 'import X as og; m = og.Model(p); t = og.Tokenizer(m)'`` timed from
outside (interpreter start to exit), so imports, config validation, session creation and the
tokenizer all count, exactly as a user pays them. Sides alternate run by run so machine load
hits both alike; the median of each side and the median of the per-pair ratios are printed.

    python benchmarks/load_time.py MODEL_DIR [--runs 10]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

SNIPPET = "import {mod} as og, sys; m = og.Model(sys.argv[1]); t = og.Tokenizer(m)"
SIDES = {"ours": "genai_runtime", "reference": "onnxruntime_genai"}


def one_run(module: str, model_dir: str) -> tuple[float, float]:
    """(wall s, CPU s of the child: user + system, all threads) for one fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", SNIPPET.format(mod=module), model_dir], check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    runs: dict[str, list[tuple[float, float]]] = {side: [] for side in SIDES}
    for module in SIDES.values():  # one unmeasured run each: page cache, first-load caches
        one_run(module, args.model_dir)
    for i in range(args.runs):
        order = list(SIDES.items()) if i % 2 == 0 else list(SIDES.items())[::-1]
        for side, module in order:
            runs[side].append(one_run(module, args.model_dir))
    for k, what in enumerate(("wall", "CPU")):
        for side, values in runs.items():
            figures = [v[k] for v in values]
            print(f"{what:4s} {side:9s} median {statistics.median(figures):.3f} s")
        ratios = [o[k] / r[k] for o, r in zip(runs["ours"], runs["reference"], strict=True)]
        print(
            f"{what:4s} ours/reference median of per-run ratios {statistics.median(ratios):.3f} "
            f"(range {min(ratios):.3f}..{max(ratios):.3f})"
        )
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
