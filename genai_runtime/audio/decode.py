"""Decode wav / flac / ogg / mp3 bytes to mono float32 PCM with soundfile (libsndfile).

soundfile: maintained, ships libsndfile inside its wheels (no system library, no ffmpeg), and
reads every container the reference's decoder reads. A file is untrusted input: only its bytes
are read, and anything libsndfile refuses becomes a GenerationError naming the file.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from ..errors import GenerationError, UnsupportedError
from .resample import resample

# Stop before decoding absurd inputs (a 10-minute 48 kHz stereo file is ~230 MB of float32).
MAX_FILE_BYTES = 512 * 1024 * 1024


def _soundfile():
    try:
        import soundfile
    except ImportError as exc:  # the optional extra is not installed
        raise UnsupportedError(
            "decoding audio files needs the 'audio' extra: pip install 'genai_runtime[audio]'"
        ) from exc
    return soundfile


def decode_audio(data: bytes, name: str = "<bytes>") -> tuple[np.ndarray, int]:
    """Decode encoded audio bytes to (mono float32 PCM in [-1, 1], sample rate)."""
    sf = _soundfile()
    if not data:
        raise GenerationError(f"{name}: empty audio file")
    try:
        pcm, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise GenerationError(
            f"{name}: not a readable audio file (wav, flac, ogg or mp3 expected): {exc}"
        ) from exc
    if pcm.size == 0:
        raise GenerationError(f"{name}: the audio file holds no samples")
    if rate <= 0:
        raise GenerationError(f"{name}: invalid sample rate {rate}")
    if pcm.shape[1] == 1:
        mono = pcm[:, 0]
    elif pcm.shape[1] == 2:  # the reference mixes stereo as (left + right) / 2 in float32
        mono = (pcm[:, 0] + pcm[:, 1]) / np.float32(2)
    else:
        mono = pcm.mean(axis=1, dtype=np.float32)
    return np.ascontiguousarray(mono, np.float32), int(rate)


def load_audio(path: str | os.PathLike, sample_rate: int = 16000) -> np.ndarray:
    """Read an audio file and return mono float32 PCM at ``sample_rate``."""
    path = Path(path)
    if not path.is_file():
        raise GenerationError(f"audio file not found: {path}")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise GenerationError(f"{path}: larger than {MAX_FILE_BYTES} bytes; refusing to decode")
    pcm, rate = decode_audio(path.read_bytes(), str(path))
    return resample(pcm, rate, sample_rate, name=str(path))
