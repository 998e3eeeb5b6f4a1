"""The prompt cache on disk: one file per block chain, kept across restarts, bounded in bytes.

Files live in ``<folder>/<namespace>/<key>.kv``: the namespace is a hash of the model folder's
recorded file hashes (or, for a folder without a record, its files' sizes and times), the
settings files as they are now, the sessions' settings (threads, providers, options), the
onnxruntime version and the cache's row shape; ``key`` is the chain key of the file's last
block (``prompt_cache.chain_keys``). A changed model or setting therefore looks in another
folder and never reads a stale entry. A file holds the chain's tokens and keys/values:

    magic (8 bytes) | version (u32) | header length (u32) | header (JSON) | rows | sha256 (32)

The header names the namespace, block size, dtype, row shape and tokens; the rows are
``[tensors, heads, tokens, head size]``; the sha256 covers everything before it. Files are
untrusted input: names must be hex, sizes and token counts are bounded, a header must match
this server, the tokens must hash to the file's name, and the checksum is checked before a file
is used. A file that fails is removed with a warning. Files are written by a background thread
(a temporary name, then renamed); the least recently used files of the folder (every namespace)
are removed to stay under the disk budget, and a chain that extends a file's replaces it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import re
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from ..config.bounded import clip_text
from ..errors import GenaiRuntimeError
from ..folder_hashes import SETTINGS_SUFFIXES, recorded_hashes, sha256_file
from .prompt_cache import KEY_BYTES, Block, PromptCache, chain_keys

log = logging.getLogger("genai_runtime.server")

DEFAULT_DISK_MB = 4096  # serve --prompt-cache-disk-mb
MAGIC = b"GRPROMPT"
VERSION = 1
_HEAD = struct.Struct("<8sII")
MAX_HEADER = 8 << 20  # bytes of JSON: about a million token ids
_SETTINGS_MAX = 16 << 20  # settings files hashed for the namespace
_NAME = re.compile(rf"^[0-9a-f]{{{2 * KEY_BYTES}}}\.kv$")
_SPACE = re.compile(r"^[0-9a-f]{32}$")
_TEMP = re.compile(rf"^\.[0-9a-f]{{{2 * KEY_BYTES}}}\.kv\.\d+\.tmp$")


@dataclass(frozen=True)
class FileFormat:
    """What a file must declare to be read here: the namespace, block size and rows (dtype and
    ``(tensors, heads, head size)``). ``PromptFiles`` keeps chains in this format; ``run
    --prompt-cache`` keeps one prompt (block 1: any number of tokens) in a file the user names."""

    space: bytes
    block: int
    dtype: np.dtype
    row_shape: tuple[int, int, int]

    @classmethod
    def single(cls, model: Any, rows: tuple[np.dtype, tuple[int, int, int]]) -> FileFormat:
        """The format of a file holding one prompt (``run --prompt-cache``): block 1, so any
        number of tokens, in the namespace of ``model`` as it is loaded now."""
        return cls(namespace(model, rows, 1), 1, np.dtype(rows[0]), tuple(rows[1]))

    def max_bytes(self, tokens: int) -> int:
        """The largest file that holds ``tokens`` tokens."""
        count, heads, width = self.row_shape
        return _HEAD.size + MAX_HEADER + tokens * count * heads * width * self.dtype.itemsize + 32

    def encode(self, tokens: np.ndarray, rows: np.ndarray) -> list[bytes]:
        """The file's bytes, in parts: head, header, rows, sha256."""
        header = json.dumps({
            "space": self.space.hex(), "block": self.block, "dtype": self.dtype.str,
            "rows": list(self.row_shape), "tokens": np.asarray(tokens).tolist(),
        }).encode()  # fmt: skip
        head = _HEAD.pack(MAGIC, VERSION, len(header))
        data = rows.astype(self.dtype.newbyteorder("<"), copy=False).tobytes()
        sha = hashlib.sha256(head)
        sha.update(header)
        sha.update(data)
        return [head, header, data, sha.digest()]

    def read(
        self,
        path: Path,
        *,
        max_tokens: int,
        max_bytes: int,
        check: bool = True,
        name: str | None = None,
        follow_links: bool = False,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """A file's tokens and (with ``check``: the checksum verified) rows; ValueError says
        why it cannot be used (``_TooLong``: sound, but over ``max_tokens``). ``name``: the
        file name its tokens must hash to."""
        flags = os.O_RDONLY | (0 if follow_links else getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(os.open(path, flags), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise ValueError(f"{size} bytes, over the limit of {max_bytes}")
            head = f.read(_HEAD.size)
            if len(head) < _HEAD.size:
                raise ValueError("truncated header")
            magic, version, length = _HEAD.unpack(head)
            if magic != MAGIC or version != VERSION:
                raise ValueError("not a prompt cache file of this version")
            if length > MAX_HEADER or _HEAD.size + length > size:
                raise ValueError(f"header of {length} bytes does not fit")
            header = f.read(length)
            tokens = self._check_header(header, max_tokens, name)
            count, heads, width = self.row_shape
            shape = (count, heads, tokens.size, width)
            payload = int(np.prod(shape)) * self.dtype.itemsize
            if size != _HEAD.size + length + payload + 32:
                raise ValueError(f"{size} bytes, {_HEAD.size + length + payload + 32} expected "
                                 "(truncated or padded)")  # fmt: skip
            if not check:
                return tokens, None
            data = f.read(payload)
            digest = f.read(32)
        sha = hashlib.sha256(head)
        sha.update(header)
        sha.update(data)
        if len(data) != payload or sha.digest() != digest:
            raise ValueError("checksum mismatch (the file was altered or cut short)")
        return tokens, np.frombuffer(data, self.dtype).reshape(shape)

    def _check_header(self, raw: bytes, max_tokens: int, name: str | None) -> np.ndarray:
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise ValueError("unreadable header") from None
        if not isinstance(doc, dict):
            raise ValueError("unreadable header")
        want = {"space": self.space.hex(), "block": self.block, "dtype": self.dtype.str,
                "rows": list(self.row_shape)}  # fmt: skip
        for field, value in want.items():
            if doc.get(field) != value:
                raise ValueError(f"header {field} {clip_text(repr(doc.get(field)), 80)}, "
                                 f"expected {value!r}")  # fmt: skip
        ids = doc.get("tokens")
        if not isinstance(ids, list) or not ids or len(ids) % self.block:
            raise ValueError("the tokens are not a list of whole blocks")
        if len(ids) > max_tokens:
            raise _TooLong(f"{len(ids)} tokens, over the context of {max_tokens}")
        if not all(type(t) is int and 0 <= t < 2**31 for t in ids):
            raise ValueError("the tokens are not token ids")
        tokens = np.array(ids, np.int64)
        if name is not None and chain_keys(self.space, tokens, self.block)[-1].hex() + ".kv" != (
                name):  # fmt: skip
            raise ValueError("the tokens do not hash to the file's name")
        return tokens


def write_file(path: Path, parts: list[bytes]) -> None:
    """Write ``parts`` to ``path`` under a temporary name in its folder, then rename it there
    (a reader never sees half a file)."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temp, "wb") as f:
            for part in parts:
                f.write(part)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def namespace(model: Any, rows: tuple[np.dtype, tuple[int, int, int]], block: int) -> bytes:
    """What a cached row depends on besides its tokens, as a 32-byte hash (see the module
    docstring): a changed weight, setting or runtime gives another namespace."""
    folder = Path(model.model_dir)
    recorded = recorded_hashes(folder)
    files: dict[str, Any] = dict(recorded)
    for entry in sorted(folder.iterdir()):
        if not entry.is_file():
            continue
        if entry.name.endswith(SETTINGS_SUFFIXES) and entry.stat().st_size <= _SETTINGS_MAX:
            files[entry.name] = sha256_file(entry)  # as it is now (a lenient load allows edits)
        elif not recorded:
            stat = entry.stat()
            files[entry.name] = [stat.st_size, stat.st_mtime_ns]
    doc = {
        "format": VERSION,
        "onnxruntime": ort.__version__,
        "files": files,
        "sessions": [repr(model.spec.sessions[name]) for name in sorted(model.spec.sessions)],
        "rows": [np.dtype(rows[0]).str, *rows[1]],
        "block": block,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).digest()


def open_prompt_cache(
    model: Any,
    slots: Any,
    *,
    mb: int,
    folder: str | Path | None,
    disk_mb: int,
    block: int,
    max_tokens: int,
) -> tuple[PromptCache | None, str]:
    """The prompt cache over ``slots`` (``mb`` MiB in memory; with ``folder``, up to
    ``disk_mb`` MiB there too), or None; and what it is, in words."""
    if mb < 0 or disk_mb <= 0:
        raise GenaiRuntimeError(
            f"prompt cache budgets must be positive (memory {mb} MiB, disk {disk_mb} MiB); a "
            "memory budget of 0 turns the cache off"
        )
    if mb == 0:
        return None, "off (a memory budget of 0)"
    if slots.copy_obstacle is not None:
        return None, f"off: {slots.copy_obstacle}"
    rows = slots.row_shape
    space = namespace(model, rows, block)
    files = None
    if folder is not None:
        files = PromptFiles(folder, space, rows, disk_mb << 20, block=block, max_tokens=max_tokens)
    cache = PromptCache(space, rows, mb << 20, block=block, files=files)
    where = f", up to {disk_mb} MiB in {folder}" if folder is not None else ""
    return cache, f"{mb} MiB of prompt keys/values in memory{where}"


@dataclass
class FileStats:
    written: int = 0
    loaded: int = 0
    dropped: int = 0  # corrupted, truncated or foreign files removed
    removed: int = 0  # removed to stay under the budget, or replaced by a longer chain


class PromptFiles:
    """The disk side of a ``PromptCache``: ``longest`` and ``load`` from the engine thread,
    ``save`` queues a write for the writer thread."""

    def __init__(
        self,
        folder: str | Path,
        space: bytes,
        rows: tuple[np.dtype, tuple[int, int, int]],
        budget: int,
        *,
        block: int,
        max_tokens: int,
    ):
        if budget <= 0:
            raise GenaiRuntimeError(
                f"the prompt cache's disk budget must be positive, got {budget}"
            )
        self.root = Path(folder)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.dir = self.root / space.hex()[:32]
            if self.dir.is_symlink():  # files are written here: never somewhere a link points
                raise GenaiRuntimeError(f"prompt cache folder {self.dir} is a link; remove it")
            self.dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise GenaiRuntimeError(
                f"prompt cache folder {folder}: {exc.strerror or exc}"
            ) from None
        self.space = space
        self.dtype, self.row_shape = np.dtype(rows[0]), tuple(rows[1])
        self.format = FileFormat(space, block, self.dtype, self.row_shape)
        self.budget = budget
        self.block = block
        self.max_tokens = max_tokens
        self.stats = FileStats()
        self._lock = threading.Lock()
        self._index: dict[bytes, str] = {}  # a block key -> a file holding the chain through it
        self._chains: dict[str, list[bytes]] = {}  # file name -> its blocks' keys
        self._queue: queue.Queue[list[Block] | None] = queue.Queue(maxsize=32)
        self._scan()
        self._writer = threading.Thread(target=self._write_loop, name="genai-prompt-files",
                                        daemon=True)  # fmt: skip
        self._writer.start()

    # -- the engine thread -----------------------------------------------------------------

    def longest(self, keys: Sequence[bytes]) -> int:
        """How many of ``keys`` (a prompt's chain) a file holds."""
        with self._lock:
            for i in range(len(keys), 0, -1):
                if keys[i - 1] in self._index:
                    return i
        return 0

    def load(self, key: bytes, tokens: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The first ``tokens`` tokens and rows of the file holding the chain through ``key``,
        checked in full first; None (and the file removed, with a warning) if it fails."""
        with self._lock:
            name = self._index.get(key)
        if name is None:
            return None
        path = self.dir / name
        try:
            found = self._read(path, check=True)
        except FileNotFoundError:  # removed meanwhile (the budget, another server)
            with self._lock:
                self._forget(name)
            return None
        except (OSError, ValueError) as exc:
            self._drop(name, str(exc))
            return None
        with self._lock:
            self.stats.loaded += 1
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used
        ids, rows = found
        return ids[:tokens], rows[:, :, :tokens]

    def save(self, chain: list[Block]) -> None:
        """Write ``chain`` (from its root) to a file, on the writer thread; dropped when the
        writer is behind."""
        try:
            self._queue.put_nowait(list(chain))
        except queue.Full:
            log.debug("prompt cache: the disk writer is behind; a chain is not written")

    def flush(self) -> None:
        """Wait until every queued chain is written."""
        self._queue.join()

    def close(self) -> None:
        self._queue.put(None)
        self._writer.join(timeout=30)

    # -- reading -----------------------------------------------------------------------------

    def _scan(self) -> None:
        """Index this namespace's files by their headers (checksums are checked on load)."""
        for entry in _entries(self.dir):
            if _TEMP.match(entry.name):  # a write cut short by a crash
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                continue
            if not _NAME.match(entry.name):
                continue
            try:
                tokens, _ = self._read(Path(entry.path), check=False)
            except _TooLong:  # sound, but longer than this server's context: left for later
                continue
            except (OSError, ValueError) as exc:
                self._drop(entry.name, str(exc))
                continue
            self._add(entry.name, chain_keys(self.space, tokens, self.block))
        self._trim(0)

    def _read(self, path: Path, *, check: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """A file's tokens and (with ``check``) rows; ValueError says why it cannot be used."""
        return self.format.read(path, max_tokens=self.max_tokens, max_bytes=self.budget,
                                check=check, name=path.name)  # fmt: skip

    def _drop(self, name: str, why: str) -> None:
        log.warning("prompt cache: %s is not used and is removed: %s", self.dir / name, why)
        with self._lock:
            self.stats.dropped += 1
            self._forget(name)
        with contextlib.suppress(OSError):
            os.unlink(self.dir / name)

    # -- writing (the writer thread) -----------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            chain = self._queue.get()
            try:
                if chain is None:
                    return
                self._write(chain)
            except Exception:  # a full disk must not stop the server: the file is skipped
                log.exception("prompt cache: a chain could not be written")
            finally:
                self._queue.task_done()

    def _write(self, chain: list[Block]) -> None:
        keys = [b.key for b in chain]
        name = keys[-1].hex() + ".kv"
        path = self.dir / name
        with self._lock:
            if name in self._chains:
                with contextlib.suppress(OSError):
                    os.utime(path)
                return
        tokens = np.concatenate([b.tokens for b in chain])
        parts = self.format.encode(tokens, np.concatenate([b.rows for b in chain], axis=2))
        size = sum(len(part) for part in parts)
        if size > self.budget:
            return
        self._trim(size)
        write_file(path, parts)
        with self._lock:
            self.stats.written += 1
            replaced = {self._index[k] for k in keys[:-1] if k in self._index}
            replaced = {n for n in replaced if self._chains[n][-1] in keys}
            for old in replaced:  # a prefix of this chain: this file holds all of it
                self._forget(old)
                self.stats.removed += 1
            self._add(name, keys)
        for old in replaced:
            with contextlib.suppress(OSError):
                os.unlink(self.dir / old)

    def _trim(self, incoming: int) -> None:
        """Remove the least recently used files of the folder (any namespace) until
        ``incoming`` more bytes fit in the budget."""
        files = []
        for space in _entries(self.root, dirs=True):
            if not _SPACE.match(space.name):
                continue
            for entry in _entries(Path(space.path)):
                if _NAME.match(entry.name):
                    with contextlib.suppress(OSError):  # gone meanwhile
                        stat = entry.stat(follow_symlinks=False)
                        files.append((stat.st_mtime_ns, stat.st_size, Path(entry.path)))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total + incoming <= self.budget:
                break
            with contextlib.suppress(OSError):
                os.unlink(path)
            total -= size
            if path.parent == self.dir:
                with self._lock:
                    self._forget(path.name)
                    self.stats.removed += 1

    # -- the index (under the lock) ------------------------------------------------------------

    def _add(self, name: str, keys: list[bytes]) -> None:
        self._chains[name] = keys
        for key in keys:
            self._index[key] = name

    def _forget(self, name: str) -> None:
        keys = self._chains.pop(name, [])
        for key in keys:
            if self._index.get(key) == name:
                del self._index[key]
                # another file may hold the same prefix
                other = next((n for n, ks in self._chains.items() if key in ks), None)
                if other is not None:
                    self._index[key] = other


class _TooLong(ValueError):
    """A file this server cannot use (its chain is longer than the context), though sound."""


def _entries(folder: Path, *, dirs: bool = False) -> list[os.DirEntry]:
    """Regular files (or folders) directly in ``folder``; links are never followed."""
    try:
        with os.scandir(folder) as it:
            return [
                e for e in it
                if (e.is_dir(follow_symlinks=False) if dirs else e.is_file(follow_symlinks=False))
            ]  # fmt: skip
    except OSError:
        return []
