"""Greedy parity of the Hugging Face folder import and the GGUF import against the reference
builder, on random-weight checkpoints of every architecture the importer builds.

    python benchmarks/hf_import_parity.py --side-python SIDE/bin/python [--work DIR]
        [--archs llama mistral qwen2 qwen3 phi3 gemma3] [--new-tokens 32]

The side environment has what this repository does not depend on: torch, transformers,
onnx_ir and onnxruntime-genai's model builder, e.g.

    python3 -m venv SIDE && SIDE/bin/pip install torch==2.13.0 transformers onnx_ir \\
        onnxruntime-genai==0.18.0 onnx safetensors

Without it (or with no ``--side-python``) the script says why and exits 0.

Per architecture: ``hf_random_checkpoint.py`` (in the side environment) writes a 2-layer
random checkpoint (6 layers for Gemma 3) with a real tokenizer (SmolLM2's, from ``../shared``, or
``--tokenizer``); the builder exports it with ``-p fp32`` and ``-p int4`` (``-e cpu``: int4 at
accuracy level 4); we import the folder, and a GGUF of the same weights (written as llama.cpp's
converter writes one, fp32 tensors), with ``--quant fp32`` and the default int4 at level 4.
Greedy tokens on five prompts (onnxruntime-genai on the builder's exports, genai_runtime on ours)
are compared: fp32 must match exactly with first-step logits within 1e-3; int4 departures are
listed with the reference's logit margin between its token and ours (< 0.05: a near-tie). A
control runs int4 at accuracy level 0 on both sides (the builder's ``--extra_options
accuracy_level=0``): the same int4 weights with fp32 activations, which separates weight
differences from int8-activation noise.
Gemma 3 goes through ``../shared/recipes/scripts/genai_builder_gemma3_patched.py`` (the 0.18
builder's fix for transformers-5 Gemma 3 configs) when that file is there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

ARCHS = ["llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3"]
SHARED = REPO.parent / "shared"
GEMMA_PATCH = SHARED / "recipes" / "scripts" / "genai_builder_gemma3_patched.py"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "Les élèves étudient la physique quantique.",
    "1, 2, 3, 4, 5,",
]


def side_ready(python: str | None) -> str | None:
    """None when the side environment can build; else why not."""
    if not python:
        return "no --side-python (an environment with torch, transformers and the builder)"
    probe = "import torch, transformers, onnx_ir, onnxruntime_genai.models.builder"
    try:
        proc = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} does not run ({exc})"
    if proc.returncode:
        return (
            f"{python} lacks torch/transformers/onnx_ir/the builder: {proc.stderr.strip()[-300:]}"
        )
    return None


# name -> (builder -p, builder --extra_options, our import settings)
PRECISIONS = {
    "fp32": ("fp32", [], {"quant": "fp32"}),
    "int4": ("int4", [], {}),  # both defaults: int4 RTN, accuracy level 4 (int8 activations)
    # A control: the same int4 weights with fp32 activations on both sides.
    "int4-level0": ("int4", ["--extra_options", "accuracy_level=0"], {"accuracy_level": 0}),
}


def build_reference(
    python: str, src: Path, out: Path, precision: str, extra: list[str], arch: str
) -> str | None:
    if out.is_dir() and (out / "genai_config.json").is_file():
        return None
    if arch == "gemma3":
        if not GEMMA_PATCH.is_file():
            return f"gemma3 needs {GEMMA_PATCH}"
        cmd = [python, str(GEMMA_PATCH)]
    else:
        cmd = [python, "-m", "onnxruntime_genai.models.builder"]
    cmd += ["-i", str(src), "-o", str(out), "-p", precision, "-e", "cpu", *extra]
    cmd += ["-c", str(out.parent / "builder-cache")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        return f"builder failed: {proc.stderr.strip()[-400:]}"
    return None


def greedy(api, folder: Path, ids: list[int], new: int) -> tuple[list[int], list[np.ndarray]]:
    model = api.Model(str(folder))
    params = api.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new, do_sample=False)
    gen = api.Generator(model, params)
    gen.append_tokens(ids)
    tokens, logits = [], []
    while not gen.is_done():
        logits.append(np.asarray(gen.get_logits()).reshape(-1).copy())
        gen.generate_next_token()
        tokens.append(int(gen.get_next_tokens()[0]))
    return tokens, logits


def compare(ref: tuple, ours: tuple) -> dict:
    """Equal tokens, or the first departure with the reference's margin between the two."""
    (rt, rl), (ot, ol) = ref, ours
    out = {"equal": rt == ot, "first_logits_max_diff": float(np.abs(rl[0] - ol[0]).max())}
    for step, (a, b) in enumerate(zip(rt, ot)):
        if a != b:
            out["departure"] = {"step": step, "ref": a, "ours": b}
            out["margin"] = float(rl[step][a] - rl[step][b])
            break
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--side-python", default=os.environ.get("GENAI_RUNTIME_SIDE_PYTHON"))
    ap.add_argument("--work", type=Path, default=None, help="keep the models here")
    ap.add_argument("--archs", nargs="+", default=ARCHS, choices=ARCHS)
    ap.add_argument("--tokenizer", type=Path, default=SHARED / "models/smollm2-135m-instruct-int4")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    why = side_ready(args.side_python)
    if why is None and not (args.tokenizer / "tokenizer.json").is_file():
        why = f"no tokenizer.json in {args.tokenizer} (pass --tokenizer DIR)"
    if why:
        print(f"hf_import_parity: skipped: {why}")
        return 0
    import onnxruntime_genai as rg
    import tokenizers
    from hf_models import write_gguf_from_hf

    import genai_runtime as og
    from genai_runtime.importer import import_model

    work = args.work or Path(tempfile.mkdtemp(prefix="hf-parity-"))
    work.mkdir(parents=True, exist_ok=True)
    todo = [a for a in args.archs if not (work / "hf" / a / "config.json").is_file()]
    if todo:
        cmd = [args.side_python, str(REPO / "benchmarks" / "hf_random_checkpoint.py")]
        cmd += [str(work / "hf"), "--tokenizer", str(args.tokenizer), "--archs", *todo]
        subprocess.run(cmd, check=True, capture_output=True)
    tok = tokenizers.Tokenizer.from_file(str(args.tokenizer / "tokenizer.json"))
    prompts = [tok.encode(p).ids for p in PROMPTS]
    results: dict = {}
    for arch in args.archs:
        src = work / "hf" / arch
        gguf = write_gguf_from_hf(src, work / f"{arch}.gguf")
        row: dict = {}
        for precision, (flag, extra, settings) in PRECISIONS.items():
            ref_dir = work / f"ref-{arch}-{precision}"
            problem = build_reference(args.side_python, src, ref_dir, flag, extra, arch)
            if problem:
                row[precision] = {"skipped": problem}
                continue
            ours = {}
            for kind, source in (("hf", src), ("gguf", gguf)):
                folder = work / f"ours-{arch}-{kind}-{precision}"
                import_model(source, folder, force=True, **settings)
                ours[kind] = folder
            per_prompt = []
            try:
                for ids in prompts:
                    ref = greedy(rg, ref_dir, ids, args.new_tokens)
                    per_prompt.append({k: compare(ref, greedy(og, f, ids, args.new_tokens))
                                       for k, f in ours.items()})  # fmt: skip
            except RuntimeError as exc:  # either runtime refusing a model is a result too
                row[precision] = {"skipped": f"run failed: {str(exc)[:300]}"}
                continue
            row[precision] = per_prompt
        results[arch] = row
        report(arch, row)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(f"models in {work}")
    return 0


def report(arch: str, row: dict) -> None:
    for precision, per_prompt in row.items():
        if isinstance(per_prompt, dict):
            print(f"{arch:8s} {precision}: skipped ({per_prompt['skipped']})")
            continue
        for kind in ("hf", "gguf"):
            runs = [p[kind] for p in per_prompt]
            equal = sum(r["equal"] for r in runs)
            worst = max(r["first_logits_max_diff"] for r in runs)
            deps = [
                f"step {r['departure']['step']} margin {r['margin']:.4f}"
                for r in runs
                if "departure" in r
            ]
            print(
                f"{arch:8s} {precision} {kind:4s}: {equal}/{len(runs)} prompts identical, "
                f"first-step logits max |diff| {worst:.2e}"
                + (f"; departures: {', '.join(deps)}" if deps else "")
            )


if __name__ == "__main__":
    sys.exit(main())
