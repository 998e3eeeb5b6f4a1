"""A bounded load run against ``genai-runtime serve`` on loopback: N clients for M seconds.

    python benchmarks/server_load.py MODEL_DIR [--clients 4] [--seconds 30] [--max-tokens 32]

Starts the server as a subprocess on 127.0.0.1 (port 0), warms it up, then each client sends
streamed chat requests back to back until the time is up. Prints requests/s, generated
tokens/s, p50/p99 time to first token, failures, the server's RSS before and after the run and
its active/queued counts afterwards (both must be 0: nothing leaked), and the RSS every 10 s.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time

import httpx
import openai

TOPICS = ["the sea", "a robot", "autumn", "coffee", "a lighthouse", "chess", "rain", "bees"]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--interleave", action="store_true", help="serve without batched decode")
    args = ap.parse_args()
    cmd = [sys.executable, "-m", "genai_runtime", "serve", args.model_dir, "--port", "0",
           "--max-active", str(args.clients)]  # fmt: skip
    if args.interleave:
        cmd.append("--interleave")
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = server.stdout.readline().split(" on ")[1].strip()
        name = args.model_dir.rstrip("/").rsplit("/", 1)[-1]
        base = url.removesuffix("/v1")
        while True:
            try:
                if httpx.get(base + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=120)

        def one(i: int) -> tuple[float, int]:
            start = time.perf_counter()
            ttft, tokens = None, 0
            ask = f"Write two sentences about {TOPICS[i % 8]}."
            stream = client.chat.completions.create(
                model=name,
                messages=[{"role": "user", "content": ask}],
                max_tokens=args.max_tokens, temperature=0.7, seed=i, stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            for chunk in stream:
                if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                    ttft = time.perf_counter() - start
                if chunk.usage:
                    tokens = chunk.usage.completion_tokens
            return (ttft if ttft is not None else time.perf_counter() - start), tokens

        for i in range(args.clients):  # warm-up: every slot allocated once
            one(i)
        rss_before = rss_mib(server.pid)
        ttfts: list[float] = []
        tokens = [0]
        failures: list[str] = []
        lock = threading.Lock()
        stop_at = time.perf_counter() + args.seconds

        def worker(k: int) -> None:
            i = k
            while time.perf_counter() < stop_at:
                try:
                    t, n = one(i)
                    with lock:
                        ttfts.append(t)
                        tokens[0] += n
                except Exception as exc:
                    with lock:
                        failures.append(f"{type(exc).__name__}: {exc}")
                i += args.clients

        samples: list[float] = []

        def sampler() -> None:  # RSS every 10 s: growth that levels off is warm-up, not a leak
            while time.perf_counter() < stop_at:
                time.sleep(10)
                samples.append(rss_mib(server.pid))

        start = time.perf_counter()
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(args.clients)]
        threads.append(threading.Thread(target=sampler))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        health = httpx.get(base + "/health").json()
        rss_after = rss_mib(server.pid)
        q = statistics.quantiles(ttfts, n=100) if len(ttfts) > 1 else ttfts * 99
        print(f"clients {args.clients}, {elapsed:.1f} s, max_tokens {args.max_tokens}, "
              f"{'interleaved' if args.interleave else 'batched'} decode")  # fmt: skip
        print(
            f"requests: {len(ttfts)} ok, {len(failures)} failed  ({len(ttfts) / elapsed:.2f} req/s)"
        )
        print(f"generated tokens/s: {tokens[0] / elapsed:.1f}")
        print(f"time to first token: p50 {q[49] * 1000:.0f} ms, p99 {q[98] * 1000:.0f} ms")
        print(f"server RSS: {rss_before:.1f} MiB before, {rss_after:.1f} MiB after")
        print("server RSS every 10 s (MiB): " + ", ".join(f"{r:.1f}" for r in samples))
        print(f"after the run: active {health['active']}, queued {health['queued']}")
        for f in failures[:5]:
            print("  failure:", f)
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
