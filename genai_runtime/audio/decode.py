"""Decode wav / flac / ogg / mp3 to mono float32 PCM with soundfile (libsndfile), in blocks.

soundfile: maintained, ships libsndfile inside its wheels (no system library, no ffmpeg), and
reads every container the reference's decoder reads. A file is untrusted input: only its bytes
are read, a block at a time (memory does not grow with the duration), and anything libsndfile
refuses becomes a GenerationError naming the file. MP3s give the samples the reference's decoder
gives (``mp3.py``).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..errors import GenerationError, UnsupportedError
from .mp3 import ZeroedReader, gapless_edit
from .resample import resample

# Encoded audio: the bytes, a path, or a seekable binary file object (an upload spooled to disk).
AudioSource = bytes | bytearray | memoryview | str | os.PathLike | BinaryIO

# Stop before reading absurd files; decoding is streamed, so this bounds time, not memory.
MAX_FILE_BYTES = 512 * 1024 * 1024
BLOCK_FRAMES = 1 << 16


def _soundfile():
    try:
        import soundfile
    except ImportError as exc:  # the optional extra is not installed
        raise UnsupportedError(
            "decoding audio files needs the 'audio' extra: pip install 'genai_runtime[audio]'"
        ) from exc
    return soundfile


def _binary(source: AudioSource, name: str) -> tuple[BinaryIO, bool]:
    """(a seekable binary file for ``source``, whether we opened it and must close it)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) == 0:
            raise GenerationError(f"{name}: empty audio file")
        return io.BytesIO(bytes(source)), True
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise GenerationError(f"audio file not found: {path}")
        size = path.stat().st_size
        if size == 0:
            raise GenerationError(f"{name}: empty audio file")
        if size > MAX_FILE_BYTES:
            raise GenerationError(f"{name}: larger than {MAX_FILE_BYTES} bytes; refusing to decode")
        return open(path, "rb"), True
    if not all(hasattr(source, attr) for attr in ("read", "seek", "tell")):
        raise GenerationError(f"{name}: expected bytes, a path or a seekable binary file")
    return source, False


class PcmReader:
    """Mono float32 PCM of one encoded clip at its own rate, read block by block."""

    def __init__(self, source: AudioSource, name: str = "<bytes>"):
        sf = _soundfile()
        self.name = name
        self._file, self._owned = _binary(source, name)
        try:
            edit = gapless_edit(self._file)
            stream = self._file
            if edit is not None and edit.zero_at is not None:
                stream = ZeroedReader(self._file, edit.zero_at, edit.zero_len)
            self._prefix = 0 if edit is None else edit.prefix  # silence the decoder dropped
            self._sound = sf.SoundFile(stream)
        except (sf.LibsndfileError, RuntimeError, TypeError, ValueError, OSError) as exc:
            self.close()
            # libsndfile's own words: soundfile's message repeats the file (a server's temp path)
            why = getattr(exc, "error_string", None) or str(exc)
            raise GenerationError(
                f"{name}: not a readable audio file (wav, flac, ogg or mp3 expected): {why}"
            ) from exc
        self.sample_rate = int(self._sound.samplerate)
        self.channels = int(self._sound.channels)
        if self.sample_rate <= 0 or self.channels <= 0:
            self.close()
            raise GenerationError(f"{name}: invalid sample rate or channel count")

    def read(self, frames: int = BLOCK_FRAMES) -> np.ndarray:
        """The next samples, at most ``frames`` (empty once the clip is read)."""
        if self._prefix:
            count = min(self._prefix, frames)
            self._prefix -= count
            return np.zeros(count, np.float32)
        block = self._read_frames(frames)
        if block.shape[1] == 1:
            return np.ascontiguousarray(block[:, 0])
        if block.shape[1] == 2:  # the reference mixes stereo as (left + right) / 2 in float32
            return (block[:, 0] + block[:, 1]) / np.float32(2)
        return block.mean(axis=1, dtype=np.float32)

    def _read_frames(self, frames: int) -> np.ndarray:
        """[n, channels] float32 straight from libsndfile. ``SoundFile.read`` seeks to where it
        already is before and after every read, and an MP3 seek restarts mpg123 without its bit
        reservoir: frames after a block edge then decode wrong (measured: up to 1.0 off on a
        CRC-protected file, 0.2 on MPEG-2 mono). Reading on without seeking avoids that."""
        sf = _soundfile()
        try:
            from soundfile import _ffi, _snd

            handle = self._sound._file
        except (ImportError, AttributeError):  # another soundfile layout: its own read
            try:
                return self._sound.read(frames, dtype="float32", always_2d=True)
            except (sf.LibsndfileError, RuntimeError, ValueError, OSError) as exc:
                raise GenerationError(f"{self.name}: the audio data is corrupt: {exc}") from exc
        out = np.empty((frames, self.channels), np.float32)
        count = _snd.sf_readf_float(handle, _ffi.cast("float *", out.ctypes.data), frames)
        if _snd.sf_error(handle):
            message = _ffi.string(_snd.sf_strerror(handle)).decode("utf-8", "replace")
            raise GenerationError(f"{self.name}: the audio data is corrupt: {message}")
        return out[: max(0, count)]

    def close(self) -> None:
        sound = getattr(self, "_sound", None)
        if sound is not None:
            sound.close()
        if self._owned:
            self._file.close()

    def __enter__(self) -> PcmReader:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def decode_audio(data: AudioSource, name: str = "<bytes>") -> tuple[np.ndarray, int]:
    """Decode a whole clip to (mono float32 PCM in [-1, 1], sample rate). Memory grows with
    the duration: ``stream.ClipReader`` reads long audio window by window instead."""
    with PcmReader(data, name) as reader:
        blocks = []
        while (block := reader.read()).size:
            blocks.append(block)
        rate = reader.sample_rate
    if not blocks:
        raise GenerationError(f"{name}: the audio file holds no samples")
    return np.concatenate(blocks), rate


def load_audio(path: str | os.PathLike, sample_rate: int = 16000) -> np.ndarray:
    """Read a whole audio file and return mono float32 PCM at ``sample_rate``."""
    pcm, rate = decode_audio(path, str(path))
    return resample(pcm, rate, sample_rate, name=str(path))
