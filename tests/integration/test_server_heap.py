"""Large refused requests give their memory back: a 1 MiB body that is parsed, tokenized and
refused used to leave the server ~100 MiB larger for good (glibc keeps freed pages); now a heap
trim follows each large request, and the server's RSS returns near where it was."""

from __future__ import annotations

import random
import string
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from genai_runtime.server.heap import BIG_BODY, HeapTrim, TrimAfterLargeRequests

pytest.importorskip("uvicorn", reason="needs the server extra")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not HeapTrim().available, reason="no glibc malloc_trim on this platform")
def test_large_refused_requests_leave_the_server_near_its_size(smollm2_2layers_dir) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "genai_runtime", "serve", str(smollm2_2layers_dir), "--port",
         "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        line = next(x for x in proc.stdout if "serving" in x)
        base = line.split(" on ")[1].split()[0].removesuffix("/v1")
        client = httpx.Client(base_url=base, timeout=120)
        name = client.get("/v1/models").json()["data"][0]["id"]
        ask = [{"role": "user", "content": "hi"}]
        client.post("/v1/chat/completions", json={"model": name, "messages": ask, "max_tokens": 4})
        before = _rss_mib(proc.pid)
        rng = random.Random(0)
        letters = string.ascii_lowercase
        words = ["".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(5000)]
        for i in range(12):
            text = " ".join(rng.choices(words, k=110_000))[: (1 << 20) - 2000]
            if i % 2:
                body = {"model": name, "prompt": text, "max_tokens": 4}
                reply = client.post("/v1/completions", json=body)
            else:
                body = {"model": name, "messages": [{"role": "user", "content": text}]}
                reply = client.post("/v1/chat/completions", json=body)
            assert reply.status_code == 400 and "context" in reply.text, reply.text[:300]
        deadline = time.monotonic() + 15  # the last trim runs on a timer thread, gap after gap
        while (grown := _rss_mib(proc.pid) - before) >= 50 and time.monotonic() < deadline:
            time.sleep(0.5)
        print(f"RSS {before:.0f} MiB before, +{grown:.0f} MiB after 12 refused 1 MiB requests")
        assert grown < 50, grown  # without the trim: ~100 MiB
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_trim_asked_within_the_gap_runs_once_the_gap_has_passed() -> None:
    calls = []
    heap = HeapTrim(trim=lambda pad: calls.append(time.monotonic()) or 1, gap_s=0.3)
    heap.request()
    time.sleep(0.1)
    assert len(calls) == 1
    heap.request()  # within the gap: waits for it
    heap.request()  # joins the one waiting
    time.sleep(0.1)
    assert len(calls) == 1
    time.sleep(0.4)
    assert len(calls) == 2 and calls[1] - calls[0] >= 0.3


def test_only_requests_with_a_large_body_schedule_a_trim() -> None:
    import asyncio

    calls = []
    heap = HeapTrim(trim=lambda pad: calls.append(pad) or 1, gap_s=0.0)

    async def app(scope, receive, send):
        while (await receive()).get("more_body"):
            pass

    async def serve(size: int) -> None:
        chunks = [{"type": "http.request", "body": b"x" * (size // 2), "more_body": True},
                  {"type": "http.request", "body": b"x" * (size - size // 2)}]  # fmt: skip
        middleware = TrimAfterLargeRequests(app, heap)
        await middleware({"type": "http"}, lambda: asyncio.sleep(0, chunks.pop(0)), None)

    asyncio.run(serve(BIG_BODY - 1))
    time.sleep(0.2)
    assert calls == []
    asyncio.run(serve(BIG_BODY))
    time.sleep(0.2)  # the timer thread's trim
    assert calls == [0]
