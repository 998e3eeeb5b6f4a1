"""Greedy parity of the Gemma 3 270M GGUF import against the reference builder's fp32 export.

    python benchmarks/gguf_gemma3_parity.py [--gguf FILE] [--new-tokens 32]

Imports the Gemma 3 270M Q4_K_M GGUF with ``--quant fp32`` (or ``--quant int4``: its Q4_K
weights as MatMulNBits, the same values) into a temporary folder, then for ten
plain prompts (BOS first; one longer than the 512-token sliding window) compares greedy tokens of
our import run by our runtime with the builder's ``gemma-3-270m-fp32`` export (under
``$GENAI_RUNTIME_MODELS``, built from the same GGUF dequantised by transformers) run by
onnxruntime-genai, and onnxruntime-genai on our import too. At a departure it prints the
reference's top-2 logit margin there: < 0.05 is a near-tie.
"""

from __future__ import annotations

import argparse
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

LONG = (
    "The history of the city begins with a small settlement on the river, where traders met "
    "to exchange salt, grain and cloth. Over the centuries the market grew into a town, the "
    "town into a city, and the city into the capital of a wide region. "
)
PROMPTS = [
    "The capital of France is",
    "Question: What is the capital of France?\nAnswer:",
    "Paris is the capital of",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4,",
    "The three primary colors are",
    "import numpy as np\n\n",
    LONG * 11 + "In one sentence, the city's story is",
]
BOS = 2


def run(api, folder: Path, prompt: str, new: int) -> tuple[list[int], list[np.ndarray], int]:
    model = api.Model(str(folder))
    ids = [int(i) for i in api.Tokenizer(model).encode(prompt)]
    if ids[:1] != [BOS]:  # neither runtime adds BOS unless asked; Gemma needs it
        ids = [BOS, *ids]
    params = api.GeneratorParams(model)
    # GroupQueryAttention wants the cache at least as long as the 512 window.
    params.set_search_options(max_length=max(1024, len(ids) + new), do_sample=False)
    gen = api.Generator(model, params)
    gen.append_tokens(np.asarray(ids, np.int32))
    toks, logits = [], []
    for _ in range(new):
        logits.append(np.asarray(gen.get_logits()).reshape(-1).copy())
        gen.generate_next_token()
        toks.append(int(gen.get_next_tokens()[0]))
    return toks, logits, len(ids)


def main() -> int:
    import onnxruntime_genai as ort_genai

    models = Path(os.environ.get("GENAI_RUNTIME_MODELS", Path.home() / "genai-models" / "onnx"))
    src = SOURCES["gemma3"]
    default = next(
        (
            p
            for p in (
                cache_root() / ".gguf" / src.filename,
                models.parent / "dl/gemma3" / src.filename,
            )
            if p.is_file()
        ),
        None,
    )
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", type=Path, default=default)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--quant", choices=("fp32", "int4"), default="fp32")
    ap.add_argument("--accuracy-level", type=int, choices=(0, 4), default=4)
    args = ap.parse_args()
    reference = models / "gemma-3-270m-fp32"
    if args.gguf is None or not (reference / "genai_config.json").is_file():
        print("needs the Gemma 3 GGUF and the reference fp32 export", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        folder = Path(tmp) / args.quant
        level = args.accuracy_level
        ours = import_gguf(args.gguf, folder, quant=args.quant, accuracy_level=level).out_dir
        print(f"import --quant {args.quant} --accuracy-level {level}: "
              f"{time.perf_counter() - start:.1f} s")  # fmt: skip
        tok = og.Tokenizer(og.Model(str(ours)))
        same = ties = 0
        for prompt in PROMPTS:
            a, _, n = run(og, ours, prompt, args.new_tokens)
            b, ref_logits, _ = run(ort_genai, reference, prompt, args.new_tokens)
            c, _, _ = run(ort_genai, ours, prompt, args.new_tokens)
            label = f"[{n} tokens] {prompt[-40:]!r}"
            if a == b:
                same += 1
                print(f"same   {label} -> {tok.decode(a)[:60]!r} (ort-genai on ours: {c == a})")
                continue
            k = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
            top2 = np.sort(ref_logits[k])[-2:]
            margin = float(top2[1] - top2[0])
            ties += margin < 0.05
            print(f"DEPART {label} at token {k}: margin {margin:.4f} (ours {a[k]} ref {b[k]})")
        print(f"{same}/{len(PROMPTS)} identical; {ties} departures at near-ties (< 0.05)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
