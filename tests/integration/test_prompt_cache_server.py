"""The server's prompt cache against real models: greedy replies (and their logprobs, to the
bit) equal with the cache on and off and after a restart from disk; memory and disk budgets
held while prompts overflow both; damaged files ignored with a warning.

Exactness is checked on an fp32 folder imported here from a tiny GGUF (exact arithmetic: the
rows a pass computes do not depend on how many rows it runs), and on the shared int4 folder,
whose MatMulNBits kernels run int8 activations (accuracy level 4): there a one-row pass rounds
differently, and the engine never prefills fewer than two tokens, so the cache changes nothing.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from conftest import AGENT_SYSTEM as SYSTEM
from conftest import captured_logs, require_shared

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from genai_runtime.cli import build_parser
from genai_runtime.errors import GenaiRuntimeError
from genai_runtime.explain import explain_model, format_report, prompt_cache_note
from genai_runtime.server import ServeOptions, ServerHandle
from genai_runtime.session.device import HOST, Device

SMALL = "smollm2-135m-instruct-int4-2layers"


@pytest.fixture(scope="module")
def fp32_folder(tiny_fp32_folder: Path) -> Path:
    return tiny_fp32_folder


def _chat(handle: ServerHandle, messages: list[dict], max_tokens: int = 8) -> tuple:
    body = {"model": handle.state.served_name, "messages": messages, "temperature": 0,
            "max_tokens": max_tokens, "logprobs": True}  # fmt: skip
    reply = httpx.post(handle.url + "/v1/chat/completions", json=body, timeout=120).json()
    choice = reply["choices"][0]
    logprobs = [c["logprob"] for c in choice["logprobs"]["content"]]
    cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
    return choice["message"]["content"], logprobs, cached


def _conversations(handle: ServerHandle, system: str = SYSTEM) -> tuple[list, list[int]]:
    """Two three-turn conversations over one system prompt, with an unrelated prompt between
    them (so the one slot no longer holds the system prompt: reuse comes from the cache)."""
    replies, cached = [], []
    for name in ("alpha", "beta"):
        messages = [{"role": "system", "content": system}]
        for turn in range(3):
            messages.append({"role": "user", "content": f"Task {name}, step {turn}: go on."})
            text, logprobs, reused = _chat(handle, messages)
            replies.append((text, logprobs))
            cached.append(reused)
            messages.append({"role": "assistant", "content": text})
        unrelated = [{"role": "user", "content": "Something else entirely, " * 4}]
        replies.append(_chat(handle, unrelated)[:2])
    return replies, cached


def _plain(folder: Path, **options) -> ServerHandle:
    return ServerHandle(str(folder), port=0, max_active=1, prompt_cache_mb=0,
                        prefix_reuse=False, **options).start()  # fmt: skip


def _cached(folder: Path, cache_dir: Path, **options) -> ServerHandle:
    return ServerHandle(str(folder), port=0, max_active=1, prompt_cache_dir=str(cache_dir),
                        **options).start()  # fmt: skip


@pytest.mark.parametrize("which", ["fp32", "int4-level4", "int4-interleaved"])
def test_greedy_replies_equal_with_the_cache_on_off_and_after_a_restart(
    which, fp32_folder, tmp_path
):
    """Interleaved slots (one executor per request) copy rows through the executor's cache."""
    folder = fp32_folder if which == "fp32" else require_shared("models", SMALL)
    options = {"batched": False} if which == "int4-interleaved" else {}
    plain = _plain(folder, **options)
    try:
        want, none = _conversations(plain)
    finally:
        plain.stop()
    assert not any(none)
    handle = _cached(folder, tmp_path, **options)
    try:
        got, cached = _conversations(handle)
        stats = handle.state.engine.prompt_cache.stats
    finally:
        handle.stop()
    assert got == want
    assert cached[0] == 0 and all(c >= 32 for c in cached[1:])
    assert cached[3] >= 32 and stats.hits >= 5  # beta's first turn: from the cache, not the slot
    restarted = _cached(folder, tmp_path, **options)
    try:
        again, cached = _conversations(restarted)
        engine = restarted.state.engine
        loaded = engine.prompt_cache.files.stats.loaded
    finally:
        restarted.stop()
    assert again == want
    assert cached[0] >= 32 and loaded >= 1  # the first prompt of a fresh server, from disk


def test_memory_and_disk_budgets_hold_while_prompts_overflow_both(tmp_path):
    folder = require_shared("models", SMALL)
    handle = _cached(folder, tmp_path, prompt_cache_mb=1, prompt_cache_disk_mb=1)
    budget = 1 << 20
    try:
        engine = handle.state.engine
        cache = engine.prompt_cache
        assert cache.block_bytes * 10 <= budget < cache.block_bytes * 11  # 2 layers: ~96 KiB
        for i in range(12):
            words = " ".join(f"w{i}x{j}" for j in range(40))
            _chat(handle, [{"role": "user", "content": words}], max_tokens=2)
            assert cache.used <= budget
            cache.flush()
            on_disk = sum(p.stat().st_size for p in tmp_path.glob("*/*.kv"))
            assert on_disk <= budget
        stats, files = cache.stats, cache.files.stats
        metrics = httpx.get(handle.url + "/metrics").text
    finally:
        handle.stop()
    assert stats.evicted_blocks > 0 and files.removed > 0
    assert stats.stored_blocks > 10 and files.written > 3  # both budgets were overflowed
    assert f"genai_prompt_cache_budget_bytes {budget}" in metrics
    assert "genai_prompt_cache_evicted_blocks_total" in metrics


def _hi(system: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": "Hi."}]


def test_a_truncated_and_an_altered_file_are_ignored_with_a_warning(tmp_path):
    folder = require_shared("models", SMALL)
    systems = [SYSTEM, "A different system prompt about cooking. " * 8]
    handle = _cached(folder, tmp_path)
    try:
        first = [_chat(handle, _hi(s)) for s in systems]
    finally:
        handle.stop()
    files = sorted(tmp_path.glob("*/*.kv"), key=lambda p: p.stat().st_mtime_ns)
    assert len(files) == 2
    data = files[0].read_bytes()
    files[0].write_bytes(data[: len(data) // 2])  # truncated
    data = bytearray(files[1].read_bytes())
    data[len(data) - 100] ^= 1  # one bit of a key/value
    files[1].write_bytes(bytes(data))
    with captured_logs("genai_runtime.server") as logs:
        restarted = _cached(folder, tmp_path)
        try:
            again = [_chat(restarted, _hi(s)) for s in systems]
            hits = restarted.state.engine.prompt_cache.stats.hit_tokens
        finally:
            restarted.stop()
    assert [a[:2] for a in again] == [f[:2] for f in first]
    assert hits == 0  # nothing came from the damaged files (a slot may share the template's head)
    assert "truncated or padded" in logs[0] and "checksum mismatch" in logs[0]
    assert logs[0].count("is not used and is removed") == 2


def test_explain_says_which_cache_kinds_the_prompt_cache_serves(smollm2_2layers_dir):
    import genai_runtime as og

    report = explain_model(og.Model(str(smollm2_2layers_dir)))
    assert report["graphs"]["kv_cache"]["prompt_cache"].startswith("yes")
    assert "prompt cache (server): yes" in format_report(report)
    for kind in ("concat", "static-scatter", "graph-scattered"):
        assert prompt_cache_note(kind, HOST).startswith("yes"), kind
    for kind in ("static-index-copy", "static-fifo", "sliding-window"):
        assert prompt_cache_note(kind, HOST).startswith("no: "), kind
    assert prompt_cache_note(None, HOST).startswith("no: ")
    cuda = Device("cuda", 0)
    assert prompt_cache_note("concat", cuda).startswith("yes")  # copied through the host
    assert prompt_cache_note("share-buffer", cuda).startswith("no: the rows live on cuda:0")


def test_prompt_cache_options_are_checked():
    parser = build_parser()
    path = str(require_shared("models", SMALL))
    args = parser.parse_args(["serve", path, "--prompt-cache-mb", "0", "--prompt-cache-dir", "d"])
    assert args.prompt_cache_mb == 0 and args.prompt_cache_dir == "d"
    assert parser.parse_args(["serve", path]).prompt_cache_mb == 512
    for flags in (["--prompt-cache-mb", "-1"], ["--prompt-cache-disk-mb", "0"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", path, *flags])
    for bad in ({"prompt_cache_mb": -1}, {"prompt_cache_mb": 1.5}, {"prompt_cache_disk_mb": 0}):
        with pytest.raises(GenaiRuntimeError, match=next(iter(bad))):
            ServeOptions(**bad)
