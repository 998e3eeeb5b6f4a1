"""Audio input as the reference reads it: bounded memory for any duration, MP3s decoded to the
reference's samples, clear errors for audio too short to have a feature frame.

MP3s are written here with soundfile (libsndfile's LAME encoder writes the Xing / LAME tag that
decoders disagree on); onnxruntime-genai's processor is run on the same files for comparison.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import require_shared

import genai_runtime as og

sf = pytest.importorskip("soundfile")

PROMPT = "<|startoftranscript|><|notimestamps|>"
MP3_RATES = (16000, 22050, 44100, 48000)


@pytest.fixture(scope="module")
def whisper_dir() -> Path:
    return require_shared("models", "whisper-tiny.en-int4")


@pytest.fixture(scope="module")
def jfk_pcm() -> np.ndarray:
    pcm, _ = sf.read(require_shared("fixtures", "audio", "jfk.flac"), dtype="float32")
    return pcm.mean(axis=1) if pcm.ndim == 2 else pcm


@pytest.fixture(scope="module")
def model(whisper_dir: Path) -> og.Model:
    return og.Model(whisper_dir)


@pytest.fixture(scope="module")
def processor(model: og.Model):
    return model.create_multimodal_processor()


@pytest.fixture(scope="module")
def reference(whisper_dir: Path):
    rg = pytest.importorskip("onnxruntime_genai")
    model = rg.Model(str(whisper_dir))
    return rg, model, model.create_multimodal_processor()


def _reference_features(reference, path: Path) -> np.ndarray:
    rg, _, ref_processor = reference
    return ref_processor(PROMPT, audios=rg.Audios.open(str(path)))["audio_features"].as_numpy()


MEMORY_SCRIPT = textwrap.dedent(
    """
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a regression fails, not swaps
    import genai_runtime as og

    def peak():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    processor = og.Model(sys.argv[1]).create_multimodal_processor()
    prompt = "<|startoftranscript|><|notimestamps|>"
    processor(prompt, audios=og.Audios.open(sys.argv[2]))  # every buffer at its full size
    base = peak()
    for path in sys.argv[3:]:
        out = processor(prompt, audios=og.Audios.open(path))
        assert out["audio_features"].shape() == [1, 80, 3000]
        print(path, peak() - base)
    """
)


def test_features_of_long_audio_take_bounded_memory(whisper_dir: Path, tmp_path: Path) -> None:
    """A minute of 48 kHz stereo WAV and five minutes of silent FLAC cost what a 31 s clip
    does (before: +380 MiB and +3.5 GiB, growing with the duration)."""
    rng = np.random.default_rng(0)
    warm, wav, flac = tmp_path / "warm.wav", tmp_path / "minute.wav", tmp_path / "silence.flac"
    sf.write(warm, (rng.standard_normal(31 * 16000) * 1000).astype(np.int16), 16000)
    sf.write(wav, (rng.standard_normal((60 * 48000, 2)) * 1000).astype(np.int16), 48000)
    silence = np.zeros(60 * 48000, np.int16)
    with sf.SoundFile(flac, "w", 48000, 1, "PCM_16", format="FLAC") as out:
        for _ in range(5):
            out.write(silence)
    run = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, str(whisper_dir), str(warm), str(wav), str(flac)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    growth = {Path(line.rsplit(" ", 1)[0]).name: int(line.rsplit(" ", 1)[1])
              for line in run.stdout.splitlines()}  # fmt: skip
    assert set(growth) == {"minute.wav", "silence.flac"}
    for name, extra in growth.items():
        assert extra < 32 << 20, f"{name}: peak RSS grew by {extra >> 20} MiB"


def test_audio_too_short_for_a_frame_is_a_clear_error(
    processor, model: og.Model, tmp_path: Path
) -> None:
    one = tmp_path / "one.wav"
    sf.write(one, np.full(1, 0.1, np.float32), 16000)
    with pytest.raises(og.GenaiRuntimeError, match=r"too short: 1 samples at 16000 Hz"):
        processor(PROMPT, audios=og.Audios.open(one))
    with pytest.raises(og.GenaiRuntimeError, match=r"too short"):
        model.transcribe(one)
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(0, np.float32), 16000)
    with pytest.raises(og.GenaiRuntimeError, match=r"holds no samples"):
        processor(PROMPT, audios=og.Audios.open(empty))
    enough = tmp_path / "enough.wav"  # one hop (10 ms): one frame, as the reference
    sf.write(enough, np.full(160, 0.1, np.float32), 16000)
    assert processor(PROMPT, audios=og.Audios.open(enough))["audio_features"].shape() == [
        1,
        80,
        3000,
    ]


def test_features_of_audio_that_starts_loud_match_the_reference(
    processor, reference, tmp_path: Path
) -> None:
    """The first frames are centered over silence, not a reflection (before: 0.35 off)."""
    noise = tmp_path / "noise.wav"
    sf.write(noise, np.random.default_rng(1).standard_normal(16000).astype(np.float32) * 0.1,
             16000, subtype="FLOAT")  # fmt: skip
    ours = processor(PROMPT, audios=og.Audios.open(noise))["audio_features"].as_numpy()
    np.testing.assert_allclose(ours, _reference_features(reference, noise), atol=1e-4, rtol=0)


def test_mp3_features_match_the_reference(
    processor, reference, jfk_pcm: np.ndarray, tmp_path: Path
) -> None:
    """MPEG-1 and MPEG-2 Layer III with a Xing/LAME tag, mono and stereo, at every rate the
    builder's Whisper reads (before: mean 0.03-0.24, max 1.1-2.0 off)."""
    pcm = jfk_pcm[: 4 * 44100]
    for channels in (1, 2):
        data = pcm if channels == 1 else np.stack([pcm, 0.5 * pcm], axis=1)
        for rate in MP3_RATES:
            path = tmp_path / f"jfk-{rate}-{channels}.mp3"
            sf.write(path, data, rate, format="MP3", subtype="MPEG_LAYER_III")
            ours = processor(PROMPT, audios=og.Audios.open(path))["audio_features"].as_numpy()
            gap = np.abs(ours - _reference_features(reference, path)).max()
            assert gap <= 1e-4, (rate, channels, gap)


def test_mp3_transcript_matches_the_reference(
    model: og.Model, reference, jfk_pcm: np.ndarray, tmp_path: Path
) -> None:
    rg, ref_model, ref_processor = reference
    path = tmp_path / "jfk.mp3"
    words = jfk_pcm[: int(3.6 * 44100)]  # "And so, my fellow Americans": a short decode
    sf.write(path, np.stack([words, words], axis=1), 44100, format="MP3")
    params = rg.GeneratorParams(ref_model)
    params.set_search_options(max_length=448)
    generator = rg.Generator(ref_model, params)
    generator.set_inputs(ref_processor(PROMPT, audios=rg.Audios.open(str(path))))
    while not generator.is_done():
        generator.generate_next_token()
    expected = ref_processor.decode(generator.get_sequence(0))
    assert "fellow Americans" in expected
    assert model.transcribe(path) == expected


def test_mp3_with_an_id3v2_tag_decodes_as_without(processor, jfk_pcm, tmp_path: Path) -> None:
    """The reference refuses MP3s that start with an ID3v2 tag; they decode here, to the same
    features as the bare stream."""
    bare = tmp_path / "bare.mp3"
    sf.write(bare, jfk_pcm[: 3 * 44100], 44100, format="MP3")
    frame = b"TIT2" + (10).to_bytes(4, "big") + b"\x00\x00" + b"\x03A title!!"[:10]
    tagged = tmp_path / "tagged.mp3"
    tagged.write_bytes(
        b"ID3\x03\x00\x00" + bytes([0, 0, 0, len(frame)]) + frame + bare.read_bytes()
    )
    a = processor.features(str(tagged), "tagged")
    b = processor.features(str(bare), "bare")
    np.testing.assert_array_equal(a, b)
