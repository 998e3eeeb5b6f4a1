"""Whisper log-mel features in NumPy, configured by the model's ``audio_processor_config.json``.

Periodic Hann window, centered STFT (silence padded on both sides), power
spectrum without the last frame, the Slaney-style mel bank Whisper uses,
``log10(max(x, 1e-10))`` clamped to ``max - 8`` and scaled ``(x + 4) / 4``; frames past the
audio (up to ``chunk_size`` seconds) take the clamped minimum; longer audio is trimmed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, ConfigProblem, GenerationError

SAMPLE_RATE = 16000


@dataclass(frozen=True)
class FeatureConfig:
    n_fft: int = 400
    frame_length: int = 400
    hop_length: int = 160
    n_mel: int = 80
    chunk_size: int = 30  # seconds
    sample_rate: int = SAMPLE_RATE

    @property
    def frames(self) -> int:
        return self.chunk_size * self.sample_rate // self.hop_length

    @classmethod
    def from_file(cls, path: str | Path) -> FeatureConfig:
        """Read the reference's processor config: a ``feature_extraction.sequence`` of ops."""
        path = Path(path)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError([f"cannot read {path}: {exc}"]) from exc
        return cls.from_dict(doc, str(path))

    @classmethod
    def from_dict(cls, doc: Any, source: str = "audio_processor_config.json") -> FeatureConfig:
        seq = doc.get("feature_extraction", {}).get("sequence") if isinstance(doc, dict) else None
        if not isinstance(seq, list):
            raise ConfigError(
                [ConfigProblem("feature_extraction.sequence", "expected a list of operations")],
                source,
            )
        values: dict[str, int] = {}
        kinds = []
        for i, entry in enumerate(seq):
            op = entry.get("operation", {}) if isinstance(entry, dict) else {}
            kinds.append(op.get("type"))
            for key, value in (op.get("attrs") or {}).items():
                if key in cls.__dataclass_fields__:
                    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                        where = f"feature_extraction.sequence[{i}].operation.attrs.{key}"
                        raise ConfigError(
                            [ConfigProblem(where, f"expected a positive integer, got {value!r}")],
                            source,
                        )
                    values[key] = value
        if "LogMelSpectrum" not in kinds:
            raise ConfigError(
                [ConfigProblem("feature_extraction.sequence",
                               f"no LogMelSpectrum operation (found: {kinds})")],
                source,
            )  # fmt: skip
        config = cls(**values)
        if config.frame_length != config.n_fft:
            raise ConfigError(
                [ConfigProblem("feature_extraction.sequence",
                               f"frame_length {config.frame_length} != n_fft {config.n_fft}")],
                source,
            )  # fmt: skip
        return config


def hann(length: int) -> np.ndarray:
    """Periodic Hann window (the one Whisper's STFT uses)."""
    return (0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(length) / length)).astype(np.float32)


def mel_filters(n_fft: int, n_mel: int, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """[n_mel, n_fft // 2 + 1] triangular filters on the Slaney mel scale, area-normalized."""
    freqs = np.arange(n_fft // 2 + 1) * sample_rate / n_fft
    max_mel = 45.245640471924965  # the Slaney mel of 8000 Hz
    mels = np.linspace(0.0, max_mel, n_mel + 2)
    f_sp, min_log_hz = 200.0 / 3.0, 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    hz = np.where(
        mels >= min_log_mel, min_log_hz * np.exp(logstep * (mels - min_log_mel)), f_sp * mels
    )
    spacing = np.diff(hz)
    ramps = hz[:, None] - freqs[None, :]
    lower = -ramps[:-2] / spacing[:-1, None]
    upper = ramps[2:] / spacing[1:, None]
    bank = np.maximum(0.0, np.minimum(lower, upper))
    bank *= (2.0 / (hz[2:] - hz[:-2]))[:, None]
    return bank.astype(np.float32)


def log_mel(pcm: np.ndarray, config: FeatureConfig | None = None) -> np.ndarray:
    """[n_mel, frames] float32 features for mono PCM at ``config.sample_rate``."""
    config = config or FeatureConfig()
    pcm = np.asarray(pcm, np.float32).reshape(-1)
    if pcm.size == 0:
        raise GenerationError("no audio samples to compute features from")
    if not np.isfinite(pcm).all():
        raise GenerationError("the audio holds NaN or infinite samples")
    limit = config.chunk_size * config.sample_rate
    pcm = pcm[:limit]
    n_fft, hop = config.n_fft, config.hop_length
    if pcm.size < hop:  # no whole frame: the reference refuses such audio too
        raise GenerationError(
            f"the audio is too short: {pcm.size} samples at {config.sample_rate} Hz; at least "
            f"{hop} ({1000 * hop / config.sample_rate:g} ms) are needed for one feature frame"
        )
    pad = n_fft // 2
    # Centered frames over silence on both sides, as the reference pads them (measured: a
    # reflected left edge moves the first two frames by up to 0.35 on audio that starts loud).
    silence = np.zeros(pad, np.float32)
    padded = np.concatenate([silence, pcm, silence])
    count = 1 + (padded.size - n_fft) // hop
    frames = np.lib.stride_tricks.as_strided(
        padded, (count, n_fft), (padded.strides[0] * hop, padded.strides[0]), writeable=False
    )
    spectrum = np.fft.rfft(frames * hann(n_fft), axis=1)
    power = (spectrum.real**2 + spectrum.imag**2).astype(np.float32)[:-1]  # drop the last frame
    mel = mel_filters(n_fft, config.n_mel, config.sample_rate) @ power.T
    logs = np.log10(np.maximum(mel, np.float32(1e-10)))
    floor = logs.max() - np.float32(8.0)
    logs = (np.maximum(logs, floor) + np.float32(4.0)) / np.float32(4.0)
    out = np.full((config.n_mel, config.frames), (floor + 4.0) / 4.0, np.float32)
    used = min(config.frames, logs.shape[1])
    out[:, :used] = logs[:, :used]
    return out
