"""The server under big prompts and stalled connections: /health latency, connections left open.

    python benchmarks/server_robustness.py MODEL_DIR [--clients 2] [--prompt-chars 1000000]
        [--seconds 20] [--stalls 40] [--wait 46]

1. /health latency: polled for ``--seconds`` while ``--clients`` threads keep posting chat
   requests with a 1,000,000-character message (just under the 1 MiB body limit; it ends in a
   context_length_exceeded 400 once templated and tokenized); printed beside an idle server's.
2. Stalled connections: ``--stalls`` connections stop sending, half in the middle of the request
   headers and half in the middle of the body; after ``--wait`` seconds, how many the server
   still holds open (the default read timeout is 30 s).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time

import httpx

from genai_runtime.server import ServerHandle


def health_latencies(url: str, seconds: float) -> list[float]:
    """Round trips of GET /health, one plain socket each (an HTTP client library's keep-alive
    adds ~40 ms of delayed ACK on loopback, which would hide what the server does)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    out = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            while sock.recv(4096):
                pass
        out.append(time.perf_counter() - start)
        time.sleep(0.01)
    return out


def summary(waits: list[float]) -> str:
    ms = sorted(w * 1000 for w in waits)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"median {statistics.median(ms):7.1f} ms, p99 {p99:7.1f} ms, max {ms[-1]:7.1f} ms"


def stalled_open(url: str, count: int, wait: float) -> int:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le"
    body = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n"
        b'Content-Type: application/json\r\n\r\n{"model": '
    )
    socks = []
    for i in range(count):
        sock = socket.create_connection((host, int(port)))
        sock.sendall(head if i % 2 == 0 else body)
        socks.append(sock)
    time.sleep(wait)
    still = 0
    for sock in socks:
        sock.setblocking(False)
        try:
            while sock.recv(65536):  # a 408 answer may come first; b"" means closed
                pass
        except BlockingIOError:
            still += 1
        except OSError:
            pass
        sock.close()
    return still


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--prompt-chars", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--stalls", type=int, default=40)
    ap.add_argument("--wait", type=float, default=46.0)
    args = ap.parse_args()
    handle = ServerHandle(args.model_dir, port=0).start()
    name = handle.state.served_name
    words = " ".join(f"w{i % 9973}x" for i in range(args.prompt_chars // 5))[: args.prompt_chars]
    body = json.dumps({"model": name, "messages": [{"role": "user", "content": words}]})
    stop = threading.Event()
    sent = [0]

    def client() -> None:
        with httpx.Client(timeout=300) as c:
            while not stop.is_set():
                c.post(handle.url + "/v1/chat/completions", content=body)
                sent[0] += 1

    try:
        idle = health_latencies(handle.url, 3.0)
        threads = [threading.Thread(target=client) for _ in range(args.clients)]
        for t in threads:
            t.start()
        busy = health_latencies(handle.url, args.seconds)
        stop.set()
        for t in threads:
            t.join()
        print(f"/health idle:                        {summary(idle)} ({len(idle)} polls)")
        print(f"/health, {args.clients} clients x {len(body) / 2**20:.2f} MiB prompts: "
              f"{summary(busy)} ({len(busy)} polls, {sent[0]} big requests)")  # fmt: skip
        if args.stalls:
            still = stalled_open(handle.url, args.stalls, args.wait)
            print(f"stalled connections still open after {args.wait:g} s: {still}/{args.stalls}")
    finally:
        handle.stop()


if __name__ == "__main__":
    main()
