"""Which attention-mask width gives onnxruntime-genai-cuda's greedy logits bit for bit.

    python benchmarks/cuda_mask_width.py FOLDER... [--new 200]

GroupQueryAttention on CUDA splits its work by the mask's width (``total_sequence_length``), so
the width a runtime feeds on decode steps changes the rounding. For each share-buffer folder this
runs the reference at ``max_length`` = prompt + new and prompt + new/2 + ... , and ours feeding
the mask at its true width ("grow") or at ``max_length`` ("full"), each in its own process, and
prints where each run's logits first differ from the reference's (``None``: never) and where
their greedy tokens part.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

PROMPT = [1, 504, 3458, 314, 260, 3575]


def run(api_name: str, folder: str, max_length: int, new: int, width: str, out: str) -> None:
    import onnxruntime

    onnxruntime.preload_dlls()
    if api_name == "ref":
        import onnxruntime_genai as api
    else:
        import genai_runtime as api
        from genai_runtime.session.positions import PositionState

        if width == "full":  # every pass binds the whole [1, max_length] buffer
            PositionState.mask_buffer = lambda self: (self._mask, self._mask.shape)
    model = api.Model(api.Config(folder))
    params = api.GeneratorParams(model)
    params.set_search_options(max_length=max_length)
    generator = api.Generator(model, params)
    generator.append_tokens(np.array([PROMPT], np.int32))
    rows = []
    while len(rows) < new and not generator.is_done():
        rows.append(np.asarray(generator.get_logits(), np.float32).reshape(-1))
        generator.generate_next_token()
    np.save(out, np.stack(rows))


def compare(ours: np.ndarray, ref: np.ndarray) -> dict:
    n = min(len(ours), len(ref))
    part = np.argmax(ours[:n], 1) != np.argmax(ref[:n], 1)
    upto = int(np.argmax(part)) + 1 if part.any() else n
    differs = (np.abs(ours[:upto] - ref[:upto]) > 0).any(axis=1)
    return {
        "first_logits_diff_step": int(np.argmax(differs)) if differs.any() else None,
        "tokens_part_step": upto - 1 if part.any() else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*")
    ap.add_argument("--new", type=int, default=200)
    ap.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        api_name, folder, max_length, new, width, out = args.worker
        return run(api_name, folder, int(max_length), int(new), width, out)
    tmp = Path(tempfile.mkdtemp())
    for folder in args.folders:
        lengths = [len(PROMPT) + args.new, len(PROMPT) + args.new + 64]
        runs = [("ref", m, "-") for m in lengths]
        runs += [("ours", m, w) for m in lengths for w in ("grow", "full")]
        files = {}
        for api_name, max_length, width in runs:
            out = tmp / f"{Path(folder).name}-{api_name}-{max_length}-{width}.npy"
            cmd = [sys.executable, __file__, "--worker", api_name, folder, str(max_length),
                   str(args.new), width, str(out)]  # fmt: skip
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if p.returncode != 0:
                print(Path(folder).name, api_name, max_length, width, "failed:", p.stderr[-600:])
                continue
            files[(api_name, max_length, width)] = np.load(out)
        result = {}
        for ref_key in [k for k in files if k[0] == "ref"]:
            for key in [k for k in files if k != ref_key]:
                result[f"{key[0]}@{key[1]}/{key[2]} vs ref@{ref_key[1]}"] = compare(
                    files[key], files[ref_key]
                )
        print(json.dumps({"folder": Path(folder).name, **result}), flush=True)


if __name__ == "__main__":
    main()
