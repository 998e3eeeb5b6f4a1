"""The server's prompt cache: keys/values of prompt prefixes, shared by every request.

A prompt is cut into blocks of ``block`` tokens; block i is keyed by a hash of block i-1's key
and block i's tokens (block 0's parent is the namespace: the model and runtime settings, see
``prompt_files.namespace``), so a key names a whole prefix. A new prompt walks its blocks and
takes the longest run held (``lookup``): a ``Lease`` that holds those blocks (reference counted:
a block in use is never evicted) until the request ends. Once a prompt is prefilled the engine
``offer``s it: the blocks not held yet are copied out of its slot. Blocks are evicted least
recently used first, leaves before the prefixes they extend, so the cache never holds more than
``budget`` bytes of keys/values; a block that cannot fit (everything else in use) is not kept.

With ``files`` (``prompt_files.PromptFiles``) every new chain is also written to disk, and a
lookup that finds a longer chain there loads it: a restart keeps what earlier runs prefilled.

Only the prompt's rows are cached, never generated ones: a reply's keys/values come from
one-token decode passes, which int4 kernels round differently from a prefill (see
``server.engine``), so a follow-up turn prefills the previous reply itself.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..errors import GenaiRuntimeError

log = logging.getLogger("genai_runtime.server")

BLOCK_TOKENS = 32  # tokens per block: the unit of matching, eviction and disk files
DEFAULT_MEMORY_MB = 512  # serve --prompt-cache-mb
KEY_BYTES = 16


def chain_keys(namespace: bytes, tokens: np.ndarray, block: int) -> list[bytes]:
    """The key of every whole block of ``tokens``: key i names tokens ``[0, (i + 1) * block)``."""
    keys, parent = [], namespace
    ids = np.ascontiguousarray(tokens, "<i8")
    for end in range(block, ids.size + 1, block):
        parent = hashlib.blake2b(
            ids[end - block : end].tobytes(), digest_size=KEY_BYTES, key=parent[:64]
        ).digest()
        keys.append(parent)
    return keys


class ChainFiles(Protocol):
    """Where chains are kept beyond memory (``prompt_files.PromptFiles``)."""

    stats: Any  # counters for /metrics

    def longest(self, keys: list[bytes]) -> int:
        """How many of ``keys`` (a prompt's chain) are kept."""

    def load(self, key: bytes, tokens: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The first ``tokens`` tokens and rows of the chain through ``key`` (None: unusable)."""

    def save(self, chain: list[Block]) -> None:
        """Keep ``chain`` (from its root)."""

    def flush(self) -> None:
        """Wait until every chain given to ``save`` is kept."""

    def close(self) -> None:
        """Flush, then stop."""


@dataclass(eq=False)
class Block:
    key: bytes
    parent: Block | None
    tokens: np.ndarray  # int64 [block]
    rows: np.ndarray  # [tensors, heads, block, head size], read-only
    refs: int = 0  # leases holding it
    children: int = 0  # held blocks that extend it

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes)


@dataclass(eq=False)
class Lease:
    """The longest held prefix of a prompt: ``length`` tokens in ``blocks`` (held until
    ``PromptCache.release``)."""

    blocks: list[Block] = field(default_factory=list)
    released: bool = False

    @property
    def length(self) -> int:
        return sum(b.tokens.size for b in self.blocks)

    def rows(self, start: int, end: int) -> np.ndarray:
        """Positions ``start:end`` of the held prefix, as ``BatchedSlots.read_rows`` gives them."""
        if not 0 <= start <= end <= self.length:
            raise GenaiRuntimeError(f"rows {start}:{end} are outside the cached {self.length}")
        size = self.blocks[0].tokens.size if self.blocks else 1
        first, last = start // size, -(-end // size)
        joined = np.concatenate([b.rows for b in self.blocks[first:last]], axis=2)
        offset = first * size
        return joined[:, :, start - offset : end - offset]


@dataclass
class CacheStats:
    lookups: int = 0
    hits: int = 0  # lookups that found at least one block
    hit_tokens: int = 0
    stored_blocks: int = 0
    evicted_blocks: int = 0
    refused_blocks: int = 0  # not kept: the budget was taken by blocks in use
    loaded_blocks: int = 0  # brought in from disk


class PromptCache:
    """Blocks of prompt keys/values under a byte ``budget``; see the module docstring.

    ``rows``: the dtype and ``(tensors, heads, head size)`` of a position's keys/values (the
    slots' ``row_shape``). Used from the engine thread only.
    """

    def __init__(
        self,
        namespace: bytes,
        rows: tuple[np.dtype, tuple[int, int, int]],
        budget: int,
        *,
        block: int = BLOCK_TOKENS,
        files: ChainFiles | None = None,
    ):
        if budget <= 0 or block <= 0:
            raise GenaiRuntimeError(f"a prompt cache needs a positive budget and block size, got "
                                    f"{budget} bytes and {block} tokens")  # fmt: skip
        self.namespace = namespace
        self.dtype, self.row_shape = np.dtype(rows[0]), tuple(rows[1])
        self.budget = budget
        self.block = block
        self.files = files
        self.used = 0  # bytes of keys/values held
        self.stats = CacheStats()
        self._blocks: OrderedDict[bytes, Block] = OrderedDict()  # least recently used first

    @property
    def block_bytes(self) -> int:
        tensors, heads, size = self.row_shape
        return tensors * heads * size * self.block * self.dtype.itemsize

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, tokens: np.ndarray, limit: int) -> Lease:
        """The longest held prefix of ``tokens[:limit]`` in whole blocks, held until
        ``release``; from disk when the files hold a longer one than memory."""
        self.stats.lookups += 1
        keys = chain_keys(self.namespace, tokens[: max(limit, 0)], self.block)
        chain = self._held(keys)
        if self.files is not None and len(chain) < len(keys):
            found = self.files.longest(keys)
            if found > len(chain):
                chain = self._load(keys[:found], chain)
        for b in chain:
            b.refs += 1
        self._touch(chain)
        if chain:
            self.stats.hits += 1
            self.stats.hit_tokens += len(chain) * self.block
        return Lease(chain)

    def release(self, lease: Lease) -> None:
        if lease.released:
            return
        lease.released = True
        for b in lease.blocks:
            b.refs -= 1

    def offer(self, tokens: np.ndarray, read: Callable[[int, int], np.ndarray]) -> int:
        """Keep the whole blocks of a prefilled prompt; ``read(start, end)`` copies its rows out
        of the slot. Returns how many tokens were added (0: all held, or no room)."""
        keys = chain_keys(self.namespace, tokens, self.block)
        chain = self._held(keys)
        before = len(chain)
        chain = self._extend(chain, keys, tokens, read)
        if len(chain) > before and self.files is not None:
            self.files.save(chain)
        return (len(chain) - before) * self.block

    def flush(self) -> None:
        """Wait until the chains offered so far are on disk (tests, benchmarks)."""
        if self.files is not None:
            self.files.flush()

    def close(self) -> None:
        """Write what is queued for the disk, then stop its writer."""
        if self.files is not None:
            self.files.close()

    # -- internals -------------------------------------------------------------------------

    def _held(self, keys: list[bytes]) -> list[Block]:
        chain = []
        for key in keys:
            b = self._blocks.get(key)
            if b is None:
                break
            chain.append(b)
        return chain

    def _touch(self, chain: list[Block]) -> None:
        """Most recently used: the chain, its root last (so leaves go before their prefixes)."""
        for b in reversed(chain):
            self._blocks.move_to_end(b.key)

    def _extend(
        self,
        chain: list[Block],
        keys: list[bytes],
        tokens: np.ndarray,
        read: Callable[[int, int], np.ndarray],
    ) -> list[Block]:
        """Add blocks ``len(chain)...`` of ``keys`` after ``chain`` while the budget allows;
        ``read(start, end)`` gives their rows. The chain is held meanwhile (never evicted to
        make room for its own next block) and is the most recently used afterwards."""
        chain = list(chain)
        for b in chain:
            b.refs += 1
        try:
            for i in range(len(chain), len(keys)):
                if not self._make_room(self.block_bytes):
                    self.stats.refused_blocks += len(keys) - i
                    break
                start, end = i * self.block, (i + 1) * self.block
                rows = np.ascontiguousarray(read(start, end), self.dtype)
                if rows.shape != (self.row_shape[0], self.row_shape[1], self.block,
                                  self.row_shape[2]):  # fmt: skip
                    raise GenaiRuntimeError(f"rows {list(rows.shape)} do not fit the cache")
                rows.flags.writeable = False
                block = Block(keys[i], chain[-1] if chain else None,
                              np.array(tokens[start:end], np.int64), rows, refs=1)  # fmt: skip
                if block.parent is not None:
                    block.parent.children += 1
                self._blocks[block.key] = block
                self.used += block.nbytes
                self.stats.stored_blocks += 1
                chain.append(block)
        finally:
            for b in chain:
                b.refs -= 1
        self._touch(chain)
        return chain

    def _make_room(self, nbytes: int) -> bool:
        if nbytes > self.budget:
            return False
        while self.used + nbytes > self.budget:
            if not self._evict_one():
                return False
        return True

    def _evict_one(self) -> bool:
        """Drop the least recently used block that is neither in use nor extended."""
        for key, b in self._blocks.items():
            if b.refs == 0 and b.children == 0:
                del self._blocks[key]
                if b.parent is not None:
                    b.parent.children -= 1
                self.used -= b.nbytes
                self.stats.evicted_blocks += 1
                return True
        return False

    def _load(self, keys: list[bytes], chain: list[Block]) -> list[Block]:
        """Bring the chain ending at ``keys[-1]`` in from disk (as much as fits); ``chain``:
        the blocks of it already held."""
        loaded = self.files.load(keys[-1], len(keys) * self.block)
        if loaded is None:
            return chain
        tokens, rows = loaded
        if chain_keys(self.namespace, tokens, self.block) != keys:  # not the chain asked for
            log.warning("prompt cache: a file's tokens are not the chain asked for; not used")
            return chain
        before = len(chain)
        chain = self._extend(chain, keys, tokens, lambda a, b: rows[:, :, a:b])
        self.stats.loaded_blocks += len(chain) - before
        return chain
