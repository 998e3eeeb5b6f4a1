"""The prompt cache's bookkeeping (blocks, leases, LRU under a byte budget) and its files on disk
(round trip, budget, untrusted and damaged files), over rows made here: the server tests run
them against real models (tests/integration/test_prompt_cache_server.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import captured_logs

from genai_runtime.batching.prompt_cache import PromptCache, chain_keys
from genai_runtime.batching.prompt_files import PromptFiles
from genai_runtime.errors import GenaiRuntimeError

BLOCK = 4
ROWS = (np.dtype(np.float32), (2, 1, 3))  # tensors, heads, head size
SPACE = hashlib.sha256(b"test").digest()
BLOCK_BYTES = 2 * 1 * 3 * BLOCK * 4


class Slot:
    """What the engine reads rows from: a prompt's keys/values, one value per position."""

    def __init__(self, tokens: np.ndarray):
        self.rows = np.empty((2, 1, tokens.size, 3), np.float32)
        self.rows[...] = tokens[None, None, :, None] * 10 + np.arange(3)
        self.reads = 0

    def read(self, start: int, end: int) -> np.ndarray:
        self.reads += 1
        return self.rows[:, :, start:end].copy()


def _offer(cache: PromptCache, tokens: list[int]) -> int:
    ids = np.array(tokens, np.int64)
    return cache.offer(ids, Slot(ids).read)


def test_a_key_names_the_whole_prefix():
    a = chain_keys(SPACE, np.arange(12), BLOCK)
    b = chain_keys(SPACE, np.array([0, 1, 2, 3, 4, 5, 6, 7, 9, 9, 9, 9, 1]), BLOCK)
    assert len(a) == 3 and len(b) == 3
    assert a[:2] == b[:2] and a[2] != b[2]
    assert chain_keys(hashlib.sha256(b"other").digest(), np.arange(12), BLOCK)[0] != a[0]
    # the same block after another prefix is another key
    assert chain_keys(SPACE, np.array([9, 9, 9, 9, 8, 9, 10, 11]), BLOCK)[1] != a[2]


def test_lookup_takes_the_longest_held_prefix_in_whole_blocks_within_the_limit():
    cache = PromptCache(SPACE, ROWS, 100 * BLOCK_BYTES, block=BLOCK)
    assert _offer(cache, list(range(11))) == 8  # two whole blocks; the tail is not cached
    prompt = np.array([*range(8), 50, 51, 52, 53])
    lease = cache.lookup(prompt, len(prompt) - 2)
    assert lease.length == 8
    np.testing.assert_array_equal(lease.rows(3, 8), Slot(np.arange(8)).rows[:, :, 3:8])
    cache.release(lease)
    assert cache.lookup(prompt, 7).length == 4  # the limit cuts the second block
    assert cache.lookup(np.array([1, 0, 2, 3, 4]), 5).length == 0
    assert cache.stats.hits == 2 and cache.stats.hit_tokens == 12


def test_offer_copies_only_blocks_not_held():
    cache = PromptCache(SPACE, ROWS, 100 * BLOCK_BYTES, block=BLOCK)
    ids = np.arange(12)
    slot = Slot(ids)
    assert cache.offer(ids[:8], slot.read) == 8 and slot.reads == 2
    assert cache.offer(ids, slot.read) == 4 and slot.reads == 3
    assert cache.offer(ids, slot.read) == 0 and slot.reads == 3


def test_the_budget_is_never_exceeded_and_leaves_go_before_their_prefixes():
    budget = 10 * BLOCK_BYTES
    cache = PromptCache(SPACE, ROWS, budget, block=BLOCK)
    system = list(range(100, 108))  # two blocks every prompt starts with
    rng = np.random.default_rng(0)
    for i in range(40):
        tail = rng.integers(0, 99, 8).tolist()
        _offer(cache, system + tail)
        assert cache.used <= budget and len(cache) <= 10
        lease = cache.lookup(np.array([*system, 0, 0, 0]), 11)
        assert lease.length == 8, i  # the shared prefix stays: leaves are evicted first
        cache.release(lease)
    assert cache.stats.evicted_blocks > 0


def test_blocks_in_use_are_never_evicted_and_what_cannot_fit_is_not_kept():
    budget = 4 * BLOCK_BYTES
    cache = PromptCache(SPACE, ROWS, budget, block=BLOCK)
    _offer(cache, list(range(16)))
    held = cache.lookup(np.arange(16), 16)
    assert held.length == 16
    assert _offer(cache, list(range(50, 58))) == 0  # every byte is in use
    assert cache.stats.refused_blocks == 2 and cache.used == budget
    cache.release(held)
    cache.release(held)  # twice is once
    assert _offer(cache, list(range(50, 58))) == 8
    assert cache.used <= budget
    assert cache.lookup(np.arange(16), 16).length == 8  # its leaves made room


def test_a_cache_needs_a_budget():
    with pytest.raises(GenaiRuntimeError, match="positive"):
        PromptCache(SPACE, ROWS, 0)


# -- on disk -----------------------------------------------------------------------------------


def _files(folder: Path, budget: int = 1 << 20) -> PromptFiles:
    return PromptFiles(folder, SPACE, ROWS, budget, block=BLOCK, max_tokens=256)


def _disk_cache(folder: Path, budget: int = 1 << 20) -> PromptCache:
    return PromptCache(SPACE, ROWS, 100 * BLOCK_BYTES, block=BLOCK, files=_files(folder, budget))


def _kv_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*/*.kv"))


def test_a_chain_on_disk_is_found_after_a_restart(tmp_path):
    cache = _disk_cache(tmp_path)
    ids = np.arange(12)
    _offer(cache, ids.tolist())
    cache.close()
    assert len(_kv_files(tmp_path)) == 1
    again = _disk_cache(tmp_path)
    lease = again.lookup(ids, 12)
    assert lease.length == 12 and again.stats.loaded_blocks == 3
    np.testing.assert_array_equal(lease.rows(0, 12), Slot(ids).rows)
    assert again.files.stats.loaded == 1
    again.close()


def test_a_longer_chain_replaces_the_file_of_its_prefix(tmp_path):
    cache = _disk_cache(tmp_path)
    _offer(cache, list(range(8)))
    cache.flush()
    _offer(cache, list(range(16)))
    cache.close()
    files = _kv_files(tmp_path)
    assert len(files) == 1
    assert files[0].stem == chain_keys(SPACE, np.arange(16), BLOCK)[-1].hex()
    again = _disk_cache(tmp_path)
    assert again.lookup(np.arange(10), 10).length == 8  # the prefix is found in the longer file
    again.close()


def test_the_disk_budget_holds_the_most_recent_files(tmp_path):
    one = len(b"GRPROMPT") + 8 + 200 + 2 * BLOCK_BYTES + 32  # a two-block file, about
    budget = 5 * one
    cache = _disk_cache(tmp_path, budget)
    for i in range(20):
        _offer(cache, [i * 8 + t for t in range(8)])
        cache.flush()
        total = sum(p.stat().st_size for p in _kv_files(tmp_path))
        assert total <= budget
    cache.close()
    assert 3 <= len(_kv_files(tmp_path)) <= 5
    assert cache.files.stats.removed > 0
    again = _disk_cache(tmp_path, budget)
    assert again.lookup(np.arange(152, 160), 8).length == 8  # the newest is kept
    again.close()


def _damaged(tmp_path: Path, damage) -> tuple[list[str], PromptCache]:
    cache = _disk_cache(tmp_path)
    _offer(cache, list(range(12)))
    cache.close()
    [path] = _kv_files(tmp_path)
    damage(path)
    with captured_logs("genai_runtime.server") as logs:
        again = _disk_cache(tmp_path)
        lease = again.lookup(np.arange(12), 12)
    assert lease.length == 0 and len(again) == 0  # never loaded
    assert not path.exists()  # and removed
    again.close()
    return logs, again


def test_a_truncated_file_is_dropped_with_a_warning(tmp_path):
    def cut(path: Path) -> None:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) - 40])

    logs, cache = _damaged(tmp_path, cut)
    assert "truncated" in logs[0] and "not used" in logs[0]
    assert cache.files.stats.dropped == 1


def test_an_altered_file_fails_its_checksum_and_is_dropped_with_a_warning(tmp_path):
    def flip(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[-60] ^= 0x40  # a key/value byte: the header still reads well
        path.write_bytes(bytes(data))

    logs, cache = _damaged(tmp_path, flip)
    assert "checksum mismatch" in logs[0] and "not used" in logs[0]
    assert cache.files.stats.dropped == 1


def test_a_header_from_elsewhere_or_with_forged_tokens_is_dropped(tmp_path):
    def forge(path: Path) -> None:  # other tokens under the same name: the checksum still holds
        data = path.read_bytes()
        head = data.index(b'"tokens": [0, 1,')
        forged = data[:head] + data[head:].replace(b"[0, 1,", b"[7, 1,", 1)
        body = forged[:-32]
        path.write_bytes(body + hashlib.sha256(body).digest())

    logs, _ = _damaged(tmp_path, forge)
    assert "do not hash to the file's name" in logs[0]


def test_only_the_caches_own_names_are_read_and_links_are_not_followed(tmp_path):
    cache = _disk_cache(tmp_path)
    space = cache.files.dir
    outside = tmp_path / "secret.txt"
    outside.write_text("not a cache file")
    (space / "notes.txt").write_text("left alone")
    name = "ab" * 16 + ".kv"
    os.symlink(outside, space / name)
    cache.close()
    again = _disk_cache(tmp_path)
    assert again.files.longest(chain_keys(SPACE, np.arange(8), BLOCK)) == 0
    again.close()
    assert outside.read_text() == "not a cache file"
    assert (space / "notes.txt").exists() and (space / name).is_symlink()


def test_a_linked_namespace_folder_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "cache"
    root.mkdir()
    os.symlink(elsewhere, root / SPACE.hex()[:32])
    with pytest.raises(GenaiRuntimeError, match="is a link"):
        _files(root)
