"""Prompt-lookup speculation inside the batched server: N concurrent requests, with and without.

    python benchmarks/server_speculation.py MODEL_DIR [--drafts 8] [--tokens 128] [--rounds 3]
        [--threads 2] [--sets grounded,edit,open,grounded-sustained] [--draft-model DIR]
    python benchmarks/server_speculation.py MODEL_DIR --widths [--threads 2]

Sets of 4 concurrent greedy chat requests, each answered by a server started with
``speculate=0`` and one with ``speculate=--drafts`` (one in-process server at a time, on
127.0.0.1; the two alternate within each round so machine load hits them alike):

- grounded: the reply copies or edits a text given in the prompt (the first four of
  ``speculative.py``'s prompts), where lookup drafts match;
- edit: an editor's or agent's edits of a whole given text (rename a function in a module, add
  type hints to it, correct a message, summarise a passage in its own words), replies of 80-140
  tokens that mostly copy the given text;
- open: questions whose replies share little with the prompt, where drafts rarely match;
- grounded-sustained: four clients each sending three of the five grounded prompts in turn,
  the next as soon as the last reply ends (a full server, where no one slow reply sets the
  wall time).

Per set it prints the aggregate decode tokens/s (every request's tokens after its first, over
the time from the first request's first token to the last request's end), each request's own
decode tokens/s, their medians over rounds, the ratios speculation / plain, whether every reply's
tokens are identical, and the server's acceptance counters. A folder imported with
``--accuracy-level 0`` runs int4 weights with fp32 activations, where a wider pass rounds like a
one-token step.

``--draft-model DIR``: the speculating server drafts with that model (``serve --draft-model``)
instead of prompt lookup.

``--widths``: what a verify pass costs by its width, the server's own slots alone: 4 rows of 300
tokens, one batched one-token ``decode`` against ``verify`` passes of 1, 2, 3, 5 and 9 tokens per
row (ms, medians of 6 calls after a warm-up; each call's rows rewound to 300 tokens first).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.request

from speculative import GROUNDED, PASSAGE

from genai_runtime.server import ServerHandle

MODULE = """import math


def mean(values):
    total = 0
    for v in values:
        total += v
    return total / len(values)


def variance(values):
    m = mean(values)
    return sum((v - m) ** 2 for v in values) / len(values)


def std_dev(values):
    return math.sqrt(variance(values))


def normalise(values):
    m = mean(values)
    s = std_dev(values)
    return [(v - m) / s for v in values]
"""
NOTE = (
    "Hi team, their are three things we need too finish before friday. First, the report on "
    "last quarters sales figures have to be send to the board. Second, we needs to book a room "
    "for the workshop on monday, because the big room are already taken. Third, everyone should "
    "updates there timesheets by thursday evening so that payroll can be run on time. Thank you "
    "all for you're hard work this month."
)
REEF = (  # speculative.py's passage and two sentences more
    f"{PASSAGE} This reef structure is composed of and built by billions of tiny organisms, "
    "known as coral polyps. It supports a wide diversity of life and was selected as a World "
    "Heritage Site in 1981."
)
EDIT = [
    "Rename the function `mean` to `average` everywhere in this module and return the whole "
    f"module:\n\n```python\n{MODULE}```",
    "Correct the spelling and grammar mistakes in this message and return the corrected "
    f"message:\n\n{NOTE}",
    f"Summarise this passage in three sentences, reusing its wording:\n\n{REEF}",
    "Add type hints to every function in this module and return the whole module:\n\n"
    f"```python\n{MODULE}```",
]
OPEN = [
    "Write a haiku about the sea.",
    "List three uses of copper and say why each works.",
    "Explain what a hash table is in one paragraph.",
    "Give two arguments for and two against remote work.",
]


def stream(url: str, model: str, prompt: str, tokens: int, out: dict) -> None:
    """One streamed greedy chat request; records its first-token and end times and tokens."""
    body = {
        "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
        "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
        "logprobs": True,
    }  # fmt: skip
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    ids: list[int] = []
    with urllib.request.urlopen(request, timeout=600) as reply:
        for raw in reply:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                for entry in (choice.get("logprobs") or {}).get("content") or []:
                    if not ids:
                        out["first"] = time.perf_counter()
                    ids.append(entry["token"])
            if chunk.get("usage"):
                out["tokens"] = chunk["usage"]["completion_tokens"]
    out["end"] = time.perf_counter()
    out["ids"] = ids


def batch(
    url: str, model: str, prompts: list[str], tokens: int, each: int = 1, clients: int = 4
) -> list[dict]:
    """The first ``clients`` prompts sent at once, one client each; with ``each`` > 1 every
    client then sends the next prompts of the list (rotated) as soon as its last reply ends, so
    the server stays full. Replies in client order, then request order."""
    clients = min(clients, len(prompts))
    outs: list[list[dict]] = [[{} for _ in range(each)] for _ in range(clients)]

    def client(i: int) -> None:
        for j in range(each):
            stream(url, model, prompts[(i + j) % len(prompts)], tokens, outs[i][j])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [o for client_outs in outs for o in client_outs]


def rates(outs: list[dict]) -> tuple[float, list[float]]:
    """Aggregate decode tok/s (every request's tokens after its first, over the time from the
    first first token to the last end) and each request's own."""
    start = min(o["first"] for o in outs)
    end = max(o["end"] for o in outs)
    total = sum(o["tokens"] - 1 for o in outs)
    own = [(o["tokens"] - 1) / max(o["end"] - o["first"], 1e-9) for o in outs]
    return total / (end - start), own


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("genai_speculative_"):
            name, value = line.split()
            out[name] = float(value)
    return out


def widths(model_dir: str, threads: int, held: int = 300, calls: int = 6) -> None:
    import numpy as np

    import genai_runtime as og
    from genai_runtime.batching.slots import BatchedSlots

    config = og.Config(model_dir)
    options = {"intra_op_num_threads": threads}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    slots = BatchedSlots(og.Model(config), 4, 1024, verify=True)
    rng = np.random.default_rng(0)
    rows = [0, 1, 2, 3]
    for s in rows:
        slots.prefill(s, rng.integers(100, 5000, held).astype(np.int64), 0)

    def timed(call) -> float:
        times = []
        for _ in range(calls + 1):  # the first is a warm-up
            for s in rows:
                slots.rewind(s, held)
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        return statistics.median(times[1:]) * 1e3

    step = timed(lambda: slots.decode(rows, np.array([7, 8, 9, 10])))
    cells = [f"decode {step:.1f} ms"]
    for width in (1, 2, 3, 5, 9):
        feeds = [rng.integers(100, 5000, width).astype(np.int64) for _ in rows]
        ms = timed(lambda feeds=feeds: slots.verify(rows, feeds))
        cells.append(f"{width}: {ms:.1f} ({ms / step:.2f})")
    print(f"{model_dir}, {threads} threads, 4 rows of {held}: " + " | ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--drafts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--widths", action="store_true", help="time verify passes by width only")
    ap.add_argument("--sets", default="grounded,edit,open,grounded-sustained",
                    help="comma-separated sets to run")  # fmt: skip
    ap.add_argument("--draft-model", help="draft with this model folder, not lookups")
    args = ap.parse_args()
    if args.widths:
        widths(args.model_dir, args.threads)
        return
    sets = {
        "grounded": (GROUNDED, 1), "edit": (EDIT, 1), "open": (OPEN, 1),
        "grounded-sustained": (GROUNDED, 3),
    }  # fmt: skip
    sets = {name: sets[name] for name in args.sets.split(",")}
    results: dict[tuple[str, int], list] = {}
    replies: dict[tuple[str, int], list] = {}
    counters = {}
    for r in range(args.rounds):
        for drafts in (0, args.drafts) if r % 2 == 0 else (args.drafts, 0):
            handle = ServerHandle(
                args.model_dir, port=0, threads=args.threads, speculate=drafts,
                prompt_cache_mb=0, prefix_reuse=False,
                draft_model=args.draft_model if drafts else None,
            )  # fmt: skip
            handle.start(timeout=600)
            try:
                url, model = handle.url, handle.state.served_name
                batch(url, model, ["Say hello."] * 4, 8)  # warm the kernels for every width
                for name, (prompts, each) in sets.items():
                    outs = batch(url, model, prompts, args.tokens, each)
                    results.setdefault((name, drafts), []).append(rates(outs))
                    replies.setdefault((name, drafts), []).append([o["ids"] for o in outs])
                if drafts:
                    counters = metrics(url)
            finally:
                handle.stop()
    print(f"model {args.model_dir}, {args.threads} threads, {args.tokens} tokens, "
          f"{args.rounds} rounds, up to {args.drafts} drafts"
          + (f" from {args.draft_model}" if args.draft_model else ""))  # fmt: skip
    for name in sets:
        plain = results[(name, 0)]
        spec = results[(name, args.drafts)]
        agg_plain = statistics.median(a for a, _ in plain)
        agg_spec = statistics.median(a for a, _ in spec)
        count = len(plain[0][1])
        own_plain = [statistics.median(o[i] for _, o in plain) for i in range(count)]
        own_spec = [statistics.median(o[i] for _, o in spec) for i in range(count)]
        same = all(
            a == b for x, y in zip(replies[(name, 0)], replies[(name, args.drafts)])
            for a, b in zip(x, y)
        )  # fmt: skip
        print(f"{name}: aggregate {agg_plain:.1f} -> {agg_spec:.1f} tok/s "
              f"({agg_spec / agg_plain:.2f}x); per request "
              + ", ".join(f"{s / p:.2f}x" for p, s in zip(own_plain, own_spec))
              + f"; tokens identical: {same}")  # fmt: skip
    print("counters (last speculating server):", counters)


if __name__ == "__main__":
    main()
