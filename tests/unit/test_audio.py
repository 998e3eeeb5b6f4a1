"""Audio features and the multimodal tensor types, without a model."""

from __future__ import annotations

import numpy as np
import pytest

import genai_runtime as og
from genai_runtime.audio import ClipReader, FeatureConfig, Resampler, log_mel, resample
from genai_runtime.audio.features import mel_filters


def _sine(freq: float, rate: int, seconds: float) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def test_resample_keeps_a_tone_and_the_length() -> None:
    out = resample(_sine(1000.0, 44100, 1.0), 44100, 16000)
    assert out.size in (16000, 16001)  # ceil(n * float32(ratio)), as the reference rounds it
    spectrum = np.abs(np.fft.rfft(out[1000:-1000]))
    peak_hz = np.argmax(spectrum) * 16000 / (out.size - 2000)
    assert abs(peak_hz - 1000.0) < 2.0


def test_resample_refuses_upsampling() -> None:
    with pytest.raises(og.GenaiRuntimeError, match="only downsampling"):
        resample(np.zeros(100, np.float32), 8000, 16000)


def test_log_mel_puts_a_tone_in_its_mel_bin_and_pads_to_thirty_seconds() -> None:
    features = log_mel(_sine(1000.0, 16000, 2.0))
    assert features.shape == (80, 3000)
    bank = mel_filters(400, 80)
    expected_bin = int(np.argmax(bank[:, round(1000 * 400 / 16000)]))
    assert abs(int(np.argmax(features[:, 100])) - expected_bin) <= 1
    assert np.all(features[:, 250:] == features[:, 250:].min())  # silence past the audio
    assert np.isfinite(features).all()


def test_log_mel_rejects_empty_and_non_finite_audio() -> None:
    with pytest.raises(og.GenaiRuntimeError, match="no audio samples"):
        log_mel(np.zeros(0, np.float32))
    with pytest.raises(og.GenaiRuntimeError, match="NaN or infinite"):
        log_mel(np.array([0.0, np.nan], np.float32))


def test_feature_config_errors_name_the_json_path() -> None:
    good = {
        "feature_extraction": {
            "sequence": [
                {"operation": {"type": "LogMelSpectrum", "attrs": {"n_fft": 400, "n_mel": 80}}}
            ]
        }
    }
    assert FeatureConfig.from_dict(good).n_mel == 80
    bad = {"feature_extraction": {"sequence": [
        {"operation": {"type": "LogMelSpectrum", "attrs": {"n_mel": -3}}}]}}  # fmt: skip
    with pytest.raises(og.ConfigError, match=r"sequence\[0\]\.operation\.attrs\.n_mel.*-3"):
        FeatureConfig.from_dict(bad)
    with pytest.raises(og.ConfigError, match="no LogMelSpectrum"):
        FeatureConfig.from_dict({"feature_extraction": {"sequence": []}})


def test_named_tensors_hold_tensors() -> None:
    inputs = og.NamedTensors()
    inputs["x"] = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert "x" in inputs and len(inputs) == 1 and inputs.keys() == ["x"]
    assert inputs["x"].shape() == [2, 3] and inputs["x"].type() == "float32"
    assert np.asarray(inputs["x"]).sum() == 15
    with pytest.raises(og.GenaiRuntimeError, match="numeric array"):
        og.Tensor(np.array(["a"]))
    with pytest.raises(og.GenaiRuntimeError, match="Tensor with name: y not found"):
        inputs["y"]  # the reference's message


def test_streamed_resampling_equals_resampling_the_whole_clip() -> None:
    rng = np.random.default_rng(3)
    for rate in (22050, 48000):
        pcm = (rng.standard_normal(rate * 2 + 7) * 0.3).astype(np.float32)
        whole = resample(pcm, rate, 16000)
        stream = Resampler(rate, 16000)
        parts, start = [], 0
        for size in rng.integers(1, 40000, size=200):
            parts.append(stream.push(pcm[start : start + size]))
            start += int(size)
            if start >= pcm.size:
                break
        parts.append(stream.finish())
        np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_clip_reader_windows_move_forward_and_report_the_end(tmp_path) -> None:
    sf = pytest.importorskip("soundfile")
    pcm = np.arange(16000 * 3, dtype=np.float32) / 16000 / 4
    path = tmp_path / "ramp.wav"
    sf.write(path, pcm, 16000, subtype="FLOAT")
    with ClipReader(path, 16000, "ramp") as clip:
        first, ends = clip.window(0, 16000)
        np.testing.assert_array_equal(first, pcm[:16000])
        assert not ends
        later, ends = clip.window(40000, 16000)  # a jump past what is buffered
        np.testing.assert_array_equal(later, pcm[40000:])
        assert ends
        with pytest.raises(og.GenaiRuntimeError, match="forward only"):
            clip.window(100, 10)
