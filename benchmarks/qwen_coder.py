"""The pulled Qwen2.5-Coder models: what the default quantisation costs, n-gram speculation, and
speed against llama.cpp on the same GGUF.

    python benchmarks/qwen_coder.py quality [--model qwen2.5-coder-0.5b] [--new-tokens 256]
    python benchmarks/qwen_coder.py quality --llama-python SIDE/bin/python [--model ...]
    python benchmarks/qwen_coder.py ngram   [--model ...] [--rounds 3] [--new-tokens 128]
    python benchmarks/qwen_coder.py speed [--llama-python SIDE/bin/python] [--threads 1 2]
    python benchmarks/qwen_coder.py speed --compare int4 int4-wide [--llama-python ...] [...]
    python benchmarks/qwen_coder.py reference --reference REF_FOLDER [--new-tokens 64]

The model comes from the pull cache (``genai-runtime pull qwen2.5-coder-0.5b``); the other
folders are imported beside it on first use (``<cache>/.bench/NAME-QUANT``).

``quality``: five coding prompts; the fp32 import decodes ``--new-tokens`` greedily, then every
other setting reads that same sequence (teacher forcing) and we count the positions where its
top-1 token equals fp32's (top-1 agreement), and the greedy tokens before its first departure.
With ``--llama-python``, llama.cpp (llama-cpp-python in that environment) reads the same ids on
the GGUF itself (``logits_all``) and is counted the same way; our token ids are fed to both, and a
warning is printed where llama.cpp's own tokenizer reads the text differently.
``ngram``: plain greedy vs n-gram prompt lookup (``speculative.ngram_size`` 3) on the
input-grounded prompts of ``speculative.py``, the two alternating in every round; decode tok/s
ratios per run (median, range) and whether the tokens equal plain greedy's.
``reference``: the reference builder's export of the same weights (REF_FOLDER, see
``qwen_coder_build_notes.md``), run by onnxruntime-genai, against our import at the same
precision (``--setting``, fp32 by default), run by genai_runtime: greedy tokens on the five chat
prompts, the first-step logits' largest difference, and any departure with the reference's logit
margin between its token and ours.
``speed``: our default import (the pulled folder) run by genai_runtime, the same folder run by
onnxruntime-genai, and llama-cpp-python (in its own environment, built here) on the same GGUF:
same prompt ids, greedy,
the same thread count; each side a fresh process per round (a warm-up, then one timed
generation), the order rotating every round; prefill and decode tok/s, ratios per round (median,
range).
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
    "int4": {"quant": "int4"},  # the GGUF's own 4-bit blocks, exact 8-bit for wider ones
    "int4-wide": {"quant": "int4-wide"},  # as int4, narrow 8-bit blocks widened to 128
    "int4-lean": {"quant": "int4-lean"},  # re-rounded to integer zero points, 8-bit blocks of 32
    "int8": {"quant": "int8"},
    "int8-wide": {"quant": "int8-wide"},  # every block as 8-bit blocks of 128
}
QUALITY_SETTINGS = ("int4-level0", "int4", "int4-wide", "int4-lean", "int8", "int8-wide")
GENAI_WORKER = r"""
import importlib, json, sys, time
api = importlib.import_module(sys.argv[1])
folder, ids = sys.argv[2], json.loads(sys.argv[3])
new, threads, rounds = (int(a) for a in sys.argv[4:7])
config = api.Config(folder)
config.overlay(json.dumps({"model": {"decoder": {"session_options": {
    "intra_op_num_threads": threads}}}}))
model = api.Model(config)
out = []
for _ in range(rounds + 1):  # the first is a warm-up
    params = api.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new, min_length=len(ids) + new,
                              do_sample=False)
    gen = api.Generator(model, params)
    t0 = time.perf_counter()
    gen.append_tokens(ids)
    t1 = time.perf_counter()
    while not gen.is_done():
        gen.generate_next_token()
    t2 = time.perf_counter()
    n = len(gen.get_sequence(0)) - len(ids)
    # the first token comes from the prefill's logits: n - 1 decode steps
    out.append({"prefill": len(ids) / (t1 - t0), "decode": (n - 1) / (t2 - t1)})
    del gen
print(json.dumps(out[1:]))
"""
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
LLAMA_QUALITY_WORKER = r"""
import json, sys
import numpy as np
from llama_cpp import Llama
gguf, threads = sys.argv[1], int(sys.argv[2])
runs = json.loads(sys.stdin.read())  # [{ids, continuation, prompt_text, continuation_text}]
n_ctx = max(len(r["ids"]) + len(r["continuation"]) for r in runs) + 8
llm = Llama(model_path=gguf, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=threads,
            n_threads_batch=threads, logits_all=True, verbose=False)
out = []
for r in runs:
    ids, cont = r["ids"], r["continuation"]
    llm.reset()
    llm.eval(ids + cont[:-1])
    # row i holds the logits after token i: rows len(ids)-1 ... predict the continuation's tokens
    rows = np.asarray(llm.scores[len(ids) - 1 : len(ids) - 1 + len(cont)])
    own = llm.tokenize(r["prompt_text"].encode(), add_bos=False, special=True)
    out.append({
        "top1": [int(t) for t in rows.argmax(axis=1)],
        "own_ids": own,
        "prompt_text": llm.detokenize(ids, special=True).decode("utf-8", "replace"),
        "continuation_text": llm.detokenize(cont, special=True).decode("utf-8", "replace"),
    })
print(json.dumps({"n_vocab": llm.n_vocab(), "runs": out}))
"""


def folder_for(name: str, setting: str) -> Path:
    """The pulled folder when it was imported with ``setting`` (or ``setting`` is "default":
    whatever pull imported it with), else one imported beside it."""
    root = cache_root()
    gguf = root / ".gguf" / SOURCES[name].filename
    pulled = root / name / "import.json"
    if setting == "default":
        if not pulled.is_file():
            sys.exit(f"no {pulled.parent}: run genai-runtime pull {name} first")
        return root / name
    if pulled.is_file():
        report = json.loads(pulled.read_text(encoding="utf-8"))
        want = {"quant": "int4", "accuracy_level": 4, **SETTINGS[setting]}
        if all(report.get(k) == v for k, v in want.items()):
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


def agreement(tops: list[list[int]], ref: list[list[int]]) -> tuple[int, int, list[int]]:
    """Positions where ``tops`` equals fp32's greedy text, all positions, and per prompt the
    greedy tokens before the first departure."""
    agree = total = 0
    same_prefix = []
    for top, cont in zip(tops, ref):
        hits = [a == b for a, b in zip(top, cont)]
        agree += sum(hits)
        total += len(hits)
        same_prefix.append(hits.index(False) if False in hits else len(hits))
    return agree, total, same_prefix


def llama_top1(args, runs: list[dict]) -> list[list[int]]:
    """llama.cpp's top-1 at the same positions, on the GGUF itself (llama-cpp-python in
    ``--llama-python``), reading our ids; warns where its own tokenizer reads the text otherwise.
    ``runs``: per prompt our ids, fp32's continuation and our tokenizer's text of both."""
    gguf = cache_root() / ".gguf" / SOURCES[args.model].filename
    cmd = [args.llama_python, "-c", LLAMA_QUALITY_WORKER, str(gguf), str(os.cpu_count() or 1)]
    proc = subprocess.run(cmd, input=json.dumps(runs), capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"llama.cpp failed: {proc.stderr.strip()[-600:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for n, (mine, theirs) in enumerate(zip(runs, got["runs"])):
        if theirs["own_ids"] != mine["ids"]:
            print(f"  warning: prompt {n}: llama.cpp tokenizes the prompt text otherwise "
                  f"({len(theirs['own_ids'])} ids, ours {len(mine['ids'])}); our ids are fed "
                  "to both")  # fmt: skip
        for key in ("prompt_text", "continuation_text"):
            if theirs[key] != mine[key]:
                print(f"  warning: prompt {n}: llama.cpp's vocabulary reads our {key[:-5]} ids "
                      "as other text")  # fmt: skip
    return [r["top1"] for r in got["runs"]]


def quality(args) -> int:
    fp32 = folder_for(args.model, "fp32")
    # fp32's greedy text, kept beside its folder: a later run compares other settings at once.
    saved = fp32.parent / f"{fp32.name}-greedy-{args.new_tokens}.json"
    ref_model = og.Model(str(fp32))
    prompts = [chat_ids(ref_model, p) for p in PROMPTS]
    kept = json.loads(saved.read_text()) if saved.is_file() else None
    if kept is not None and kept["prompts"] == prompts:
        ref = kept["greedy"]
    else:
        ref = [greedy(ref_model, ids, args.new_tokens) for ids in prompts]
        saved.write_text(json.dumps({"prompts": prompts, "greedy": ref}))
    tok = og.Tokenizer(ref_model)
    texts = []  # our tokenizer's text of each prompt and continuation, for llama.cpp's check
    for text, cont in zip(PROMPTS, ref):
        messages = json.dumps([{"role": "user", "content": text}])
        texts.append((tok.apply_chat_template(messages, add_generation_prompt=True),
                      tok.decode(cont)))  # fmt: skip
    del tok, ref_model
    print(f"{args.model}: top-1 agreement with the fp32 import over {args.new_tokens} tokens "
          f"x {len(PROMPTS)} prompts (teacher-forced on fp32's greedy text)")  # fmt: skip
    for setting in args.settings or QUALITY_SETTINGS:
        model = og.Model(str(folder_for(args.model, setting)))
        tops = [forced_top1(model, ids, cont) for ids, cont in zip(prompts, ref)]
        del model
        agree, total, same_prefix = agreement(tops, ref)
        print(f"  {setting:12s} top-1 agreement {agree / total:.3f} ({agree}/{total}); greedy "
              f"tokens before the first departure: {same_prefix}")  # fmt: skip
    if not args.llama_python:
        print("  llama.cpp: skipped: no --llama-python (an environment with llama-cpp-python)")
        return 0
    runs = [{"ids": ids, "continuation": cont, "prompt_text": pt, "continuation_text": ct}
            for ids, cont, (pt, ct) in zip(prompts, ref, texts)]  # fmt: skip
    agree, total, same_prefix = agreement(llama_top1(args, runs), ref)
    print(f"  {'llama.cpp':12s} top-1 agreement {agree / total:.3f} ({agree}/{total}); greedy "
          f"tokens before the first departure: {same_prefix} "
          f"({SOURCES[args.model].filename})")  # fmt: skip
    return 0


def ngram(args) -> int:
    from speculative import GROUNDED

    folder = folder_for(args.model, args.setting or "default")
    plain = og.Model(str(folder))
    config = og.Config(str(folder))
    speculative = {"ngram_size": 3, "max_draft_tokens": args.k}
    if args.fixed_k:
        speculative["min_adaptive_k"] = 0  # 0: not adaptive (the v1 key)
    config.overlay(json.dumps({"speculative": speculative}))
    spec = og.Model(config)
    prompts = [chat_ids(plain, t) for t in GROUNDED]
    ratios, agree, rates = [], 0, {"plain": [], "ngram": []}
    kept: list[tuple[int, int, int]] = []  # per n-gram run: drafts kept, verified, passes
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
                if mode == "ngram":
                    stats = gen.get_speculative_stats()
                    kept.append((stats["accepted"], stats["proposed"], stats["rounds"]))
            ratios.append(tps["ngram"] / tps["plain"])
            agree += outs["ngram"] == outs["plain"]
    print(f"{args.model} n-gram (size 3, up to {args.k} drafts) vs plain greedy, "
          f"{len(GROUNDED)} input-grounded prompts x {args.rounds} rounds, {args.new_tokens} new "
          f"tokens: ratio median {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max "
          f"{max(ratios):.2f}); plain {statistics.median(rates['plain']):.1f} tok/s, n-gram "
          f"{statistics.median(rates['ngram']):.1f} tok/s (medians); identical tokens in "
          f"{agree}/{len(ratios)} runs")  # fmt: skip
    print("  per run: ratio, drafts kept / verified, target passes: " + "; ".join(
        f"{ratio:.2f}, {a}/{p}, {n}" for ratio, (a, p, n) in zip(ratios, kept)))  # fmt: skip
    return 0


def reference(args) -> int:
    import onnxruntime_genai as rg

    if not args.reference or not (Path(args.reference) / "genai_config.json").is_file():
        sys.exit("reference: --reference must be the builder's export (a folder with genai_config)")
    args.setting = args.setting or "fp32"
    folder = folder_for(args.model, args.setting)
    ours_model = og.Model(str(folder))
    prompts = [chat_ids(ours_model, p) for p in PROMPTS]
    del ours_model
    runs: dict[str, list] = {}
    for side, api, path in (("ref", rg, args.reference), ("ours", og, str(folder))):
        model = api.Model(path)  # one model at a time: an fp32 0.5B is 2.5 GB
        runs[side] = []
        for ids in prompts:
            params = api.GeneratorParams(model)
            params.set_search_options(max_length=len(ids) + args.new_tokens, do_sample=False)
            gen = api.Generator(model, params)
            gen.append_tokens(ids)
            toks, logits = [], []
            while not gen.is_done():
                logits.append(np.asarray(gen.get_logits()).reshape(-1).copy())
                gen.generate_next_token()
                toks.append(int(gen.get_next_tokens()[0]))
            runs[side].append((toks, logits))
            del gen
        del model
    equal, worst = 0, 0.0
    for n, ids in enumerate(prompts):
        (rt, rl), (ot, ol) = runs["ref"][n], runs["ours"][n]
        diff = float(np.abs(rl[0] - ol[0]).max())
        worst = max(worst, diff)
        equal += rt == ot
        line = f"  prompt {n}: {len(ids)} prompt ids, {len(rt)} tokens, "
        line += f"first-step logits max |diff| {diff:.2e}, "
        step = next((i for i, (a, b) in enumerate(zip(rt, ot)) if a != b), None)
        if step is None and len(rt) == len(ot):
            line += "identical"
        elif step is None:
            line += f"lengths differ ({len(rt)} vs {len(ot)})"
        else:
            margin = float(rl[step][rt[step]] - rl[step][ot[step]])
            line += f"departs at step {step} (reference's margin {margin:.4f})"
        print(line)
    print(
        f"{args.model} {args.setting} vs the builder's export: {equal}/{len(prompts)} prompts "
        f"identical over {args.new_tokens} greedy tokens, first-step logits within {worst:.2e}"
    )
    return 0


def run_side(side: str, args, folder: Path, gguf: Path, ids: list[int], threads: int) -> dict:
    """One timed generation (after a warm-up) in a fresh process of its own."""
    if side == "llama.cpp":
        cmd = [args.llama_python, "-c", LLAMA_WORKER, str(gguf), json.dumps(ids)]
    elif side.startswith("ours:"):  # --compare: our import with that setting
        folder = folder_for(args.model, side.removeprefix("ours:"))
        cmd = [sys.executable, "-c", GENAI_WORKER, "genai_runtime", str(folder), json.dumps(ids)]
    else:
        module = "genai_runtime" if side == "ours" else "onnxruntime_genai"
        cmd = [sys.executable, "-c", GENAI_WORKER, module, str(folder), json.dumps(ids)]
    cmd += [str(args.new_tokens), str(threads), "1"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=str(REPO))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.exit(f"{side} failed: {proc.stderr.strip()[-600:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])[0]


def compare(args) -> int:
    """speed --compare A B ...: our imports with those settings, each run by genai_runtime in a
    fresh process per round (order rotating); ratios to the first setting per round."""
    gguf = cache_root() / ".gguf" / SOURCES[args.model].filename
    folders = {s: folder_for(args.model, s) for s in args.compare}
    ids = chat_ids(og.Model(str(folders[args.compare[0]])), PROMPTS[0] + " " + PROMPTS[1])
    order = [f"ours:{s}" for s in args.compare] + (["llama.cpp"] if args.llama_python else [])
    base = order[0]
    print(
        f"{args.model}: our imports {', '.join(f'{s} ({f.name})' for s, f in folders.items())} "
        f"run by genai_runtime; {len(ids)} prompt tokens, {args.new_tokens} new, greedy; each a "
        "fresh process per round, order rotating"
    )
    for threads in args.threads:
        runs: dict[str, list[dict]] = {side: [] for side in order}
        for r in range(args.rounds):
            for side in order[r % len(order) :] + order[: r % len(order)]:
                runs[side].append(run_side(side, args, folders[args.compare[0]], gguf, ids,
                                           threads))  # fmt: skip
        # each setting against the first; with --llama-python, each setting against llama.cpp
        pairs = [(side, base) for side in order[1:]]
        if args.llama_python:
            pairs = pairs[:-1] + [(side, "llama.cpp") for side in order[:-1]]
        for side, other in pairs:
            for key in ("prefill", "decode"):
                ratios = [o[key] / t[key] for o, t in zip(runs[side], runs[other])]
                mine = statistics.median(s[key] for s in runs[side])
                theirs = statistics.median(s[key] for s in runs[other])
                print(
                    f"{threads} thread(s) {key:7s}: {side.removeprefix('ours:')} {mine:7.1f} "
                    f"tok/s, {other.removeprefix('ours:')} {theirs:7.1f} tok/s; ratio median "
                    f"{statistics.median(ratios):.2f} (min {min(ratios):.2f}, max "
                    f"{max(ratios):.2f}) over {len(ratios)} rounds"
                )
        for side in order:
            spread = [f"{s['prefill']:.1f}/{s['decode']:.1f}" for s in runs[side]]
            print(f"{threads} thread(s) {side.removeprefix('ours:')} prefill/decode tok/s per "
                  f"round: {', '.join(spread)}")  # fmt: skip
    return 0


def speed(args) -> int:
    if args.compare:
        return compare(args)
    gguf = cache_root() / ".gguf" / SOURCES[args.model].filename
    folder = folder_for(args.model, "default")
    ids = chat_ids(og.Model(str(folder)), PROMPTS[0] + " " + PROMPTS[1])
    refs = ["onnxruntime-genai"]
    if args.llama_python:
        refs.append("llama.cpp")
    else:
        print("llama.cpp: skipped: no --llama-python (an environment with llama-cpp-python)")
    order = ["ours", *refs]
    print(
        f"{args.model}: our default import ({folder.name}), run by genai_runtime and by "
        f"onnxruntime-genai; llama.cpp on {gguf.name}; {len(ids)} prompt tokens, "
        f"{args.new_tokens} new, greedy; each side a fresh process per round, order rotating"
    )
    for threads in args.threads:
        runs: dict[str, list[dict]] = {side: [] for side in order}
        for r in range(args.rounds):
            for side in order[r % len(order) :] + order[: r % len(order)]:
                runs[side].append(run_side(side, args, folder, gguf, ids, threads))
        for ref in refs:
            for key in ("prefill", "decode"):
                ratios = [o[key] / t[key] for o, t in zip(runs["ours"], runs[ref])]
                ours = statistics.median(s[key] for s in runs["ours"])
                theirs = statistics.median(s[key] for s in runs[ref])
                print(
                    f"{threads} thread(s) {key:7s}: ours {ours:7.1f} tok/s, {ref} {theirs:7.1f} "
                    f"tok/s; ours/{ref} median {statistics.median(ratios):.2f} (min "
                    f"{min(ratios):.2f}, max {max(ratios):.2f}) over {len(ratios)} rounds"
                )
        for side in order:
            spread = [f"{s['decode']:.1f}" for s in runs[side]]
            print(f"{threads} thread(s) {side} decode tok/s per round: {', '.join(spread)}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("what", choices=("quality", "ngram", "speed", "reference"))
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", choices=sorted(SOURCES))
    ap.add_argument("--new-tokens", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-k", type=int, default=8, help="n-gram: max draft tokens per round")
    ap.add_argument("--fixed-k", action="store_true",
                    help="n-gram: always draft up to -k tokens (no adaptive K)")  # fmt: skip
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reference", help="reference: the builder's export of the same weights")
    ap.add_argument("--setting", choices=sorted(SETTINGS),
                    help="reference: our import compared (default fp32); ngram: the folder "
                         "(default: the pulled folder, as pull imported it)")  # fmt: skip
    ap.add_argument("--llama-python", default=os.environ.get("GENAI_RUNTIME_LLAMA_PYTHON"))
    ap.add_argument("--settings", nargs="+", choices=sorted(SETTINGS),
                    help="quality: the settings compared with fp32 (default: "
                         f"{' '.join(QUALITY_SETTINGS)})")  # fmt: skip
    ap.add_argument("--compare", nargs="+", choices=sorted(SETTINGS), metavar="SETTING",
                    help="speed: our imports with these settings against each other (ratios "
                         "to the first), instead of onnxruntime-genai and llama.cpp")  # fmt: skip
    args = ap.parse_args()
    if args.new_tokens is None:
        args.new_tokens = {"quality": 256, "ngram": 128, "speed": 64, "reference": 64}[args.what]
    run = {"quality": quality, "ngram": ngram, "speed": speed, "reference": reference}
    return run[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
