"""The pulled Qwen2.5-Coder models: what the default quantisation costs, n-gram speculation, and
speed against llama.cpp on the same GGUF.

    python benchmarks/qwen_coder.py quality [--model qwen2.5-coder-0.5b] [--new-tokens 256]
    python benchmarks/qwen_coder.py ngram   [--model ...] [--rounds 3] [--new-tokens 128]
    python benchmarks/qwen_coder.py llama-cpp --llama-python SIDE/bin/python [--threads 1 2]

The model comes from the pull cache (``genai-runtime pull qwen2.5-coder-0.5b``); the other
folders are imported beside it on first use (``<cache>/.bench/NAME-QUANT``).

``quality``: five coding prompts; the fp32 import decodes ``--new-tokens`` greedily, then every
other setting reads that same sequence (teacher forcing) and we count the positions where its
top-1 token equals fp32's (top-1 agreement), and the greedy tokens before its first departure.
``ngram``: plain greedy vs n-gram prompt lookup (``speculative.ngram_size`` 3) on the
input-grounded prompts of ``speculative.py``, the two alternating in every round; decode tok/s
ratios per run (median, range) and whether the tokens equal plain greedy's.
``llama-cpp``: our default import and llama-cpp-python (in its own environment, built here) on
the same GGUF, same prompt ids, greedy, the same thread count; prefill and decode tok/s, the two
sides alternating every round; ratios per round (median, range).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import genai_runtime as og  # noqa: E402
from genai_runtime.importer import import_model  # noqa: E402
from genai_runtime.importer.cache import cache_root  # noqa: E402
from genai_runtime.importer.catalogue import SOURCES  # noqa: E402

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Explain what a Python list comprehension is, with an example.",
    "Write a SQL query that returns the ten customers with the highest total order value.",
    "Write a bash one-liner that counts the lines of every .py file under the current folder.",
    "Implement binary search in JavaScript and explain its complexity.",
]
SETTINGS = {  # name -> import settings
    "fp32": {"quant": "fp32"},
    "int4-level0": {"quant": "int4", "accuracy_level": 0},
    "int4": {},  # the default: int4 (the GGUF's own 4-bit blocks, exact 8-bit for wider ones)
    "int8": {"quant": "int8"},
}
LLAMA_WORKER = r"""
import json, sys, time
from llama_cpp import Llama
gguf, ids = sys.argv[1], json.loads(sys.argv[2])
new, threads, rounds = (int(a) for a in sys.argv[3:6])
llm = Llama(model_path=gguf, n_ctx=len(ids) + new + 8, n_threads=threads, n_threads_batch=threads,
            n_batch=512, verbose=False, logits_all=False)
out = []
for _ in range(rounds + 1):  # the first is a warm-up
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    t1 = time.perf_counter()
    toks = []
    for _ in range(new):
        tok = int(llm.sample(temp=0.0, top_k=1))
        toks.append(tok)
        llm.eval([tok])
    t2 = time.perf_counter()
    out.append({"prefill": len(ids) / (t1 - t0), "decode": new / (t2 - t1), "tokens": toks})
print(json.dumps(out[1:]))
"""


def folder_for(name: str, setting: str) -> Path:
    root = cache_root()
    gguf = root / ".gguf" / SOURCES[name].filename
    if setting == "int4" and (root / name / "genai_config.json").is_file():
        return root / name
    out = root / ".bench" / f"{name}-{setting}"
    if not (out / "genai_config.json").is_file():
        if not gguf.is_file():
            sys.exit(f"no {gguf}: run genai-runtime pull {name} first")
        import_model(gguf, out, force=True, **SETTINGS[setting])
    return out


def chat_ids(model: og.Model, text: str) -> list[int]:
    tok = og.Tokenizer(model)
    messages = json.dumps([{"role": "user", "content": text}])
    text = tok.apply_chat_template(messages, add_generation_prompt=True)
    return [int(i) for i in tok.encode(text)]


def greedy(model: og.Model, ids: list[int], new: int) -> list[int]:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    while not gen.is_done():
        gen.generate_next_token()
    return [int(t) for t in gen.get_sequence(0)[len(ids) :]]


def forced_top1(model: og.Model, ids: list[int], continuation: list[int]) -> list[int]:
    """Top-1 token at each position of ``continuation`` when the model reads it (one pass)."""
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + len(continuation) + 1)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    top = [int(np.argmax(gen.get_logits().reshape(-1)))]
    for tok in continuation[:-1]:
        gen.append_tokens([tok])
        top.append(int(np.argmax(gen.get_logits().reshape(-1))))
    return top


def quality(args) -> int:
    ref_model = og.Model(str(folder_for(args.model, "fp32")))
    prompts = [chat_ids(ref_model, p) for p in PROMPTS]
    ref = [greedy(ref_model, ids, args.new_tokens) for ids in prompts]
    del ref_model
    print(f"{args.model}: top-1 agreement with the fp32 import over {args.new_tokens} tokens "
          f"x {len(PROMPTS)} prompts (teacher-forced on fp32's greedy text)")  # fmt: skip
    for setting in ("int4-level0", "int4", "int8"):
        model = og.Model(str(folder_for(args.model, setting)))
        agree = total = 0
        same_prefix = []
        for ids, cont in zip(prompts, ref):
            top = forced_top1(model, ids, cont)
            hits = [a == b for a, b in zip(top, cont)]
            agree += sum(hits)
            total += len(hits)
            same_prefix.append(hits.index(False) if False in hits else len(hits))
        print(f"  {setting:12s} top-1 agreement {agree / total:.3f} ({agree}/{total}); greedy "
              f"tokens before the first departure: {same_prefix}")  # fmt: skip
    return 0


def ngram(args) -> int:
    from speculative import GROUNDED

    folder = folder_for(args.model, "int4")
    plain = og.Model(str(folder))
    config = og.Config(str(folder))
    config.overlay(json.dumps({"speculative": {"ngram_size": 3, "max_draft_tokens": args.k}}))
    spec = og.Model(config)
    prompts = [chat_ids(plain, t) for t in GROUNDED]
    ratios, agree, rates = [], 0, {"plain": [], "ngram": []}
    for r in range(args.rounds):
        for ids in prompts:
            outs, tps = {}, {}
            for mode in ("plain", "ngram") if r % 2 == 0 else ("ngram", "plain"):
                m = plain if mode == "plain" else spec
                params = og.GeneratorParams(m)
                params.set_search_options(max_length=len(ids) + args.new_tokens, do_sample=False)
                gen = og.Generator(m, params)
                gen.append_tokens(ids)
                t0 = time.perf_counter()
                while not gen.is_done():
                    gen.generate_next_token()
                dt = time.perf_counter() - t0
                outs[mode] = list(gen.get_sequence(0)[len(ids) :])
                tps[mode] = (len(outs[mode]) - 1) / dt
                rates[mode].append(tps[mode])
            ratios.append(tps["ngram"] / tps["plain"])
            agree += outs["ngram"] == outs["plain"]
    print(f"{args.model} n-gram (size 3, up to {args.k} drafts) vs plain greedy, "
          f"{len(GROUNDED)} input-grounded prompts x {args.rounds} rounds, {args.new_tokens} new "
          f"tokens: ratio median {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max "
          f"{max(ratios):.2f}); plain {statistics.median(rates['plain']):.1f} tok/s, n-gram "
          f"{statistics.median(rates['ngram']):.1f} tok/s (medians); identical tokens in "
          f"{agree}/{len(ratios)} runs")  # fmt: skip
    return 0


def ours_timing(folder: Path, ids: list[int], new: int, threads: int) -> dict:
    config = og.Config(str(folder))
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": threads}}}}))  # fmt: skip
    model = og.Model(config)
    out = []
    for _ in range(2):  # a warm-up, then the timed run
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + new, min_length=len(ids) + new)
        gen = og.Generator(model, params)
        t0 = time.perf_counter()
        gen.append_tokens(ids)
        t1 = time.perf_counter()
        while not gen.is_done():
            gen.generate_next_token()
        t2 = time.perf_counter()
        n = len(gen.get_sequence(0)) - len(ids)
        out.append({"prefill": len(ids) / (t1 - t0), "decode": (n - 1) / (t2 - t1)})
    return out[-1]


def llama_cpp(args) -> int:
    if not args.llama_python:
        print("llama-cpp: skipped: no --llama-python (an environment with llama-cpp-python)")
        return 0
    gguf = cache_root() / ".gguf" / SOURCES[args.model].filename
    folder = folder_for(args.model, "int4")
    ids = chat_ids(og.Model(str(folder)), PROMPTS[0] + " " + PROMPTS[1])
    for threads in args.threads:
        ratios = {"prefill": [], "decode": []}
        sides = {"ours": [], "llama.cpp": []}
        for r in range(args.rounds):
            for side in ("ours", "llama.cpp") if r % 2 == 0 else ("llama.cpp", "ours"):
                if side == "ours":
                    sides[side].append(ours_timing(folder, ids, args.new_tokens, threads))
                else:
                    cmd = [args.llama_python, "-c", LLAMA_WORKER, str(gguf), json.dumps(ids)]
                    cmd += [str(args.new_tokens), str(threads), "1"]
                    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
                    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
                    sides[side].append(json.loads(proc.stdout)[0])
            for key in ratios:
                ratios[key].append(sides["ours"][-1][key] / sides["llama.cpp"][-1][key])
        for key in ("prefill", "decode"):
            ours = statistics.median(s[key] for s in sides["ours"])
            ref = statistics.median(s[key] for s in sides["llama.cpp"])
            rs = ratios[key]
            print(f"{args.model} {threads} thread(s) {key:7s}: ours {ours:7.1f} tok/s, llama.cpp "
                  f"{ref:7.1f} tok/s; ours/llama.cpp median {statistics.median(rs):.2f} "
                  f"(min {min(rs):.2f}, max {max(rs):.2f}) over {len(rs)} rounds "
                  f"({len(ids)} prompt tokens, {args.new_tokens} new)")  # fmt: skip
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("what", choices=("quality", "ngram", "llama-cpp"))
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", choices=sorted(SOURCES))
    ap.add_argument("--new-tokens", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-k", type=int, default=8, help="n-gram: max draft tokens per round")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--llama-python", default=os.environ.get("GENAI_RUNTIME_LLAMA_PYTHON"))
    args = ap.parse_args()
    if args.new_tokens is None:
        args.new_tokens = {"quality": 256, "ngram": 128, "llama-cpp": 64}[args.what]
    return {"quality": quality, "ngram": ngram, "llama-cpp": llama_cpp}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
