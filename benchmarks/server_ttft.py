"""Time to first token of the OpenAI server for two or more model folders, in one process.

    python benchmarks/server_ttft.py BASELINE_DIR OTHER_DIR [...] [--rounds 6] [--prompt TEXT]

Each folder is served on its own loopback port; every round sends each server one chat request
(``max_tokens`` 1, greedy) whose prompt starts with the round number, so no prefix is reused
from an earlier round; the order alternates every round and the first round is a warm-up.
Prints each folder's median request time and its ratio to the first folder's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import openai

from genai_runtime.server import ServerHandle

PROMPT = (
    "Explain what this Python code does, line by line, and suggest one improvement: import os, "
    "sys; def walk(root): total = 0; for dirpath, dirnames, filenames in os.walk(root): for name "
    "in filenames: if name.endswith('.py'): path = os.path.join(dirpath, name); with open(path) "
    "as f: total += sum(1 for line in f if line.strip() and not line.strip().startswith('#')); "
    "return total; if __name__ == '__main__': print(walk(sys.argv[1] if len(sys.argv) > 1 else "
    "'.')). Then write a unit test for it with pytest and a temporary directory, and explain how "
    "the test isolates the file system."
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--prompt", default=PROMPT)
    args = ap.parse_args()
    handles = [ServerHandle(f, port=0).start() for f in args.folders]
    try:
        clients = [
            openai.OpenAI(base_url=h.url + "/v1", api_key="x", max_retries=0) for h in handles
        ]
        times: list[list[float]] = [[] for _ in handles]
        for r in range(args.rounds):
            order = range(len(handles)) if r % 2 == 0 else reversed(range(len(handles)))
            for i in order:
                messages = [{"role": "user", "content": f"Request {r}. {args.prompt}"}]
                start = time.perf_counter()
                clients[i].chat.completions.create(
                    model=handles[i].state.served_name, messages=messages, max_tokens=1,
                    temperature=0,
                )  # fmt: skip
                if r:  # round 0 warms up
                    times[i].append(time.perf_counter() - start)
    finally:
        for handle in handles:
            handle.stop()
    base = statistics.median(times[0])
    for folder, spent in zip(args.folders, times):
        median = statistics.median(spent)
        print(f"{folder}: median {median * 1000:.0f} ms over {len(spent)} requests "
              f"(x{base / median:.2f} the first folder's speed)")  # fmt: skip


if __name__ == "__main__":
    main()
