"""A soak of `genai-runtime serve`: mixed requests for a while, the server's RSS sampled, and the
slope of its growth over the run's later part reported (with any 5xx).

    python benchmarks/soak.py MODEL --minutes 10 [--clients 4] [--every 10]

The mix, cycled by each client: a chat reply, a streamed chat reply, a completion with logprobs,
a forced tool call, a json_schema reply, a request over the context (refused, 400), a malformed
body (400). The slope is a least-squares line through the RSS samples after the first fifth of
the run (warm-up: caches, arenas and the grammar compiler settle).
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import threading
import time

import httpx


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def requests(name: str) -> list[tuple[str, dict]]:
    ask = [{"role": "user", "content": "Tell me about the sea."}]
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"]}}}  # fmt: skip
    return [
        ("/v1/chat/completions", {"model": name, "messages": ask, "max_tokens": 24}),
        (
            "/v1/chat/completions",
            {"model": name, "messages": ask, "max_tokens": 24, "stream": True},
        ),
        (
            "/v1/completions",
            {"model": name, "prompt": "Once upon", "max_tokens": 16, "logprobs": 3},
        ),
        (
            "/v1/chat/completions",
            {
                "model": name,
                "messages": ask,
                "tools": [tool],
                "tool_choice": "required",
                "max_tokens": 32,
            },
        ),
        (
            "/v1/chat/completions",
            {
                "model": name,
                "messages": ask,
                "max_tokens": 48,
                "response_format": {"type": "json_object"},
            },
        ),
        ("/v1/completions", {"model": name, "prompt": "word " * 20000, "max_tokens": 4}),
        ("/v1/chat/completions", {"model": name, "messages": "not a list"}),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--every", type=float, default=10.0, help="seconds between RSS samples")
    args = parser.parse_args()
    proc = subprocess.Popen(
        [sys.executable, "-m", "genai_runtime", "serve", args.model, "--port", "0",
         "--max-context", "8192"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    line = proc.stdout.readline()
    url, name = line.split(" on ", 1)[1].split()[0].removesuffix("/v1"), line.split("'")[1]
    mix = requests(name)
    counts: dict[int, int] = {}
    lock = threading.Lock()
    stop = time.monotonic() + args.minutes * 60

    def client(offset: int) -> None:
        with httpx.Client(timeout=120) as http:
            for path, body in itertools.islice(itertools.cycle(mix), offset, None):
                if time.monotonic() > stop:
                    return
                if body.get("stream"):
                    with http.stream("POST", url + path, json=body) as reply:
                        for _ in reply.iter_lines():
                            pass
                        status = reply.status_code
                else:
                    status = http.post(url + path, json=body).status_code
                with lock:
                    counts[status] = counts.get(status, 0) + 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    samples = []
    while any(t.is_alive() for t in threads):
        samples.append(((time.monotonic() - start) / 60, rss_mib(proc.pid)))
        time.sleep(args.every)
    for t in threads:
        t.join()
    proc.terminate()
    proc.wait(30)
    later = [s for s in samples if s[0] >= args.minutes / 5]
    n = len(later)
    mx = sum(t for t, _ in later) / n
    my = sum(r for _, r in later) / n
    slope = sum((t - mx) * (r - my) for t, r in later) / sum((t - mx) ** 2 for t, _ in later)
    print(f"samples: {len(samples)} over {samples[-1][0]:.1f} min; RSS first {samples[0][1]:.0f} "
          f"MiB, at one fifth {later[0][1]:.0f} MiB, last {samples[-1][1]:.0f} MiB")  # fmt: skip
    print(f"slope over the last four fifths: {slope:+.3f} MiB/min")
    print("responses by status: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    fivexx = sum(v for k, v in counts.items() if k >= 500)
    print(f"5xx: {fivexx}")
    return 1 if fivexx else 0


if __name__ == "__main__":
    sys.exit(main())
