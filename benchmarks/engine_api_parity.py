"""Run ``engine_api_script.py`` (written for onnxruntime-genai 0.18's Engine) unchanged on the
reference and on genai_runtime, and compare tokens, finish reasons and usage turn by turn.

genai_runtime's side runs the same file with ``onnxruntime_genai`` bound to ``genai_runtime`` in
``sys.modules`` (nothing in the script is edited). Each side runs in its own process, the two
alternating ``--repeat`` times; the engine time (from the first ``begin_turn`` to the last event)
is reported as medians and their ratio. Exit status 1 when any turn differs.

    python benchmarks/engine_api_parity.py [MODEL_DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "engine_api_script.py"
SHIM = (
    "import runpy, sys, genai_runtime; sys.modules['onnxruntime_genai'] = genai_runtime; "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def run(side: str, model_dir: str) -> dict:
    if side == "reference":
        command = [sys.executable, str(SCRIPT), model_dir]
    else:
        command = [sys.executable, "-c", SHIM, str(SCRIPT), model_dir]
    proc = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "model_dir",
        nargs="?",
        default=str(HERE.parent.parent / "shared" / "models" / "smollm2-135m-instruct-int4"),
    )
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"reference": [], "genai_runtime": []}
    for _ in range(args.repeat):
        for side in results:
            results[side].append(run(side, args.model_dir))
    ref, ours = results["reference"][0]["turns"], results["genai_runtime"][0]["turns"]
    same = True
    print(f"{'turn':5} {'reference':>34} {'genai_runtime':>34}  tokens")
    for key in sorted(set(ref) | set(ours)):
        a, b = ref.get(key, {}), ours.get(key, {})
        equal = a == b
        same &= equal and all(
            r["turns"] == results["reference"][0]["turns"] for r in results["reference"]
        )
        same &= all(r["turns"] == ours for r in results["genai_runtime"])

        def cell(t: dict) -> str:
            return f"{t.get('finish_reason', '-')} {len(t.get('tokens', []))} {t.get('usage')}"

        print(f"{key:5} {cell(a):>34} {cell(b):>34}  {'equal' if equal else 'DIFFER'}")
    times = {
        side: statistics.median(r["engine_seconds"] for r in runs) for side, runs in results.items()
    }
    print(
        f"engine time, median of {args.repeat}: reference {times['reference']:.2f} s, "
        f"genai_runtime {times['genai_runtime']:.2f} s "
        f"(ratio {times['genai_runtime'] / times['reference']:.2f})"
    )
    print("every turn equal" if same else "TURNS DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
