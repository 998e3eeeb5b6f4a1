"""Decode speed and cache memory of two exports of the same weights, measured alternately.

    python benchmarks/kv_caches.py STATIC_DIR SHARE_DIR [--rounds 5] [--new-tokens 64]

STATIC_DIR: the mobius ``--static-cache`` SmolLM2 with a config from
``tests/kv/configs/mobius-static512`` beside it; SHARE_DIR: the reference builder's share-buffer
export. Rounds alternate between the two in one process, so load on the machine hits both alike;
the script prints per-model medians, the static/share ratio, the cache kind, bytes after the run
and whether the cache buffers stayed the same objects across decode steps (no per-step copies).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import genai_runtime as og

PROMPT = "Here is a short story about a lighthouse keeper who finds a message in a bottle."


def _buffers(cache) -> list[int]:
    arrays = getattr(cache, "_arrays", None)
    return [a.__array_interface__["data"][0] for a in arrays] if arrays is not None else []


def _round(model: og.Model, ids: np.ndarray, new_tokens: int) -> dict:
    params = og.GeneratorParams(model)
    total = len(ids) + new_tokens
    params.set_search_options(max_length=total, min_length=total)
    generator = og.Generator(model, params)
    start = time.perf_counter()
    generator.append_tokens(ids)
    generator.generate_next_token()
    first = time.perf_counter()
    buffers = _buffers(generator.kv_cache)
    while not generator.is_done():
        generator.generate_next_token()
    end = time.perf_counter()
    cache = generator.kv_cache
    return {
        "prefill_s": first - start,
        "decode_tok_s": (new_tokens - 1) / (end - first),
        "kind": cache.kind,
        "nbytes": cache.nbytes,
        "length": cache.length,
        "same_buffers": buffers == _buffers(cache),
        "tokens": generator.get_sequence(0)[len(ids) :].tolist(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("static_dir")
    parser.add_argument("share_dir")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    models = {"static-scatter": og.Model(args.static_dir), "share-buffer": og.Model(args.share_dir)}
    ids = og.Tokenizer(models["static-scatter"]).encode(PROMPT)
    results: dict[str, list[dict]] = {name: [] for name in models}
    for _ in range(args.rounds + 1):  # the first round warms up and is dropped
        for name, model in models.items():
            results[name].append(_round(model, ids, args.new_tokens))
    medians = {}
    for name, runs in results.items():
        runs = runs[1:]
        last = runs[-1]
        medians[name] = statistics.median(r["decode_tok_s"] for r in runs)
        print(
            f"{name:15s} decode {medians[name]:7.1f} tok/s  prefill "
            f"{statistics.median(r['prefill_s'] for r in runs) * 1e3:6.1f} ms  cache {last['kind']}"
            f" {last['nbytes'] / 2**20:.2f} MiB after {last['length']} tokens  same buffers "
            f"across steps: {all(r['same_buffers'] for r in runs)}"
        )
    ratio = medians["static-scatter"] / medians["share-buffer"]
    same = results["static-scatter"][-1]["tokens"] == results["share-buffer"][-1]["tokens"]
    print(f"static/share decode ratio {ratio:.3f}; identical greedy tokens: {same}")


if __name__ == "__main__":
    main()
