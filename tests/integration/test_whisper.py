"""Whisper end to end on the one executor: features, encoder + cross cache, greedy ids.

Targets: the shared golden (the reference's ids for jfk.flac), the reference's exact encoder input
(jfk.features.npz), and onnxruntime-genai run side by side for a batch of two clips.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import genai_runtime as og
from genai_runtime.audio import load_audio, log_mel
from tests.conftest import require_shared

sf = pytest.importorskip("soundfile")

PROMPT = "<|startoftranscript|><|notimestamps|>"


@pytest.fixture(scope="module")
def whisper_dir() -> Path:
    return require_shared("models", "whisper-tiny.en-int4")


@pytest.fixture(scope="module")
def jfk() -> Path:
    return require_shared("fixtures", "audio", "jfk.flac")


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(
        require_shared("fixtures", "audio", "whisper-tiny.en-int4-jfk.json").read_text()
    )


@pytest.fixture(scope="module")
def reference_features() -> dict:
    with np.load(require_shared("fixtures", "audio", "jfk.features.npz")) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def model(whisper_dir: Path) -> og.Model:
    return og.Model(whisper_dir)


@pytest.fixture(scope="module")
def second_clip(jfk: Path, tmp_path_factory) -> Path:
    """The last 4.5 s of jfk.flac as 16-bit 44.1 kHz wav: another clip, another container."""
    pcm, rate = sf.read(jfk, dtype="float32")
    path = tmp_path_factory.mktemp("audio") / "ask.wav"
    sf.write(path, pcm[int(6.5 * rate) :], rate, subtype="PCM_16")
    return path


def _run(generator: og.Generator) -> list[list[int]]:
    while not generator.is_done():
        generator.generate_next_token()
    return [generator.get_sequence(i).tolist() for i in range(generator.batch_size)]


def test_features_match_the_reference(jfk: Path, reference_features: dict) -> None:
    ours = log_mel(load_audio(jfk))
    ref = reference_features["audio_features"][0]
    assert ours.shape == ref.shape == (80, 3000)
    assert np.abs(ours - ref).max() <= 1e-3


def test_ids_from_the_reference_features_equal_the_golden(
    model: og.Model, reference_features: dict, golden: dict
) -> None:
    generator = og.Generator(model, og.GeneratorParams(model))
    inputs = og.NamedTensors()
    inputs["audio_features"] = og.Tensor(reference_features["audio_features"])
    inputs["input_ids"] = reference_features["input_ids"]
    generator.set_inputs(inputs)
    (row,) = _run(generator)
    assert row == golden["output_ids"]


def test_ids_from_the_audio_file_equal_the_golden(model: og.Model, jfk: Path, golden: dict) -> None:
    processor = model.create_multimodal_processor()
    inputs = processor(PROMPT, audios=og.Audios.open(jfk))
    assert inputs["audio_features"].shape() == [1, 80, 3000]
    assert inputs["input_ids"].as_numpy().tolist() == [[50257, 50362]]
    generator = og.Generator(model, og.GeneratorParams(model))
    generator.set_inputs(inputs)
    (row,) = _run(generator)
    assert row == golden["output_ids"]
    assert processor.decode(row) == golden["text"]
    assert model.transcribe(jfk) == golden["text"]


def test_batch_of_two_clips_equals_the_reference(
    model: og.Model, jfk: Path, second_clip: Path
) -> None:
    ref_og = pytest.importorskip("onnxruntime_genai")
    paths = [str(jfk), str(second_clip)]
    ref_model = ref_og.Model(str(model.model_dir))
    ref_processor = ref_model.create_multimodal_processor()
    ref_params = ref_og.GeneratorParams(ref_model)
    ref_params.set_search_options(do_sample=False, batch_size=2, max_length=448)
    ref_gen = ref_og.Generator(ref_model, ref_params)
    ref_gen.set_inputs(ref_processor([PROMPT] * 2, audios=ref_og.Audios.open(*paths)))
    while not ref_gen.is_done():
        ref_gen.generate_next_token()
    expected = [ref_gen.get_sequence(i).tolist() for i in range(2)]

    ref_inputs = ref_processor([PROMPT] * 2, audios=ref_og.Audios.open(*paths))
    ref_features = ref_inputs["audio_features"].as_numpy()

    processor = model.create_multimodal_processor()
    params = og.GeneratorParams(model)
    params.set_search_options(batch_size=2)
    ours = processor([PROMPT] * 2, audios=og.Audios.open(*paths))
    features = ours["audio_features"].as_numpy()
    # Both clips' features are the reference's (the second starts mid-word: its first frames
    # are centered over silence, as the reference pads them).
    np.testing.assert_allclose(features, ref_features, atol=1e-4, rtol=0)
    # Decoder parity, isolated: the reference's features give exactly the reference's tokens.
    generator = og.Generator(model, params)
    generator.set_inputs(
        og.NamedTensors(
            {"audio_features": ref_features, "input_ids": ref_inputs["input_ids"].as_numpy()}
        )
    )
    assert _run(generator) == expected
    # End to end: the same tokens, or the first departure is a near-tie in our own run.
    generator = og.Generator(model, params)
    generator.set_inputs(ours)
    rows, margins = [], []
    while not generator.is_done():
        top = np.sort(generator.get_logits()[:, 0], axis=-1)[:, -2:]
        margins.append(top[:, 1] - top[:, 0])
        generator.generate_next_token()
    rows = [generator.get_sequence(i).tolist() for i in range(2)]
    for row, (got, want) in enumerate(zip(rows, expected)):
        diff = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
        if diff:
            step = diff[0] - len(ref_inputs["input_ids"].as_numpy()[row])
            assert margins[step][row] < 0.05, (row, step, margins[step][row])
    text = processor.decode(rows[1])
    assert "ask what you can do for your country." in text


def test_rewind_into_the_prompt_keeps_the_cross_cache(
    model: og.Model, reference_features: dict, golden: dict
) -> None:
    generator = og.Generator(model, og.GeneratorParams(model))
    generator.set_inputs(dict(reference_features))
    first = _run(generator)
    cross = generator._exec.cross
    epoch = cross.epoch
    generator.rewind_to(1)  # inside the two-token decoder prompt
    generator.append_tokens([[50362]])
    assert _run(generator) == first
    assert cross.epoch == epoch  # the encoder did not run again
    generator.rewind_to(0)
    generator.append_tokens(reference_features["input_ids"])
    assert _run(generator) == first
    assert first[0] == golden["output_ids"]


def test_bad_audio_input_is_a_clear_error_and_the_generator_stays_usable(
    model: og.Model, reference_features: dict, golden: dict, tmp_path: Path
) -> None:
    processor = model.create_multimodal_processor()
    not_audio = tmp_path / "notes.wav"
    not_audio.write_text("this is text, not audio")
    with pytest.raises(og.GenaiRuntimeError, match=r"notes\.wav: not a readable audio file"):
        processor(PROMPT, audios=og.Audios.open(not_audio))
    slow = tmp_path / "8k.wav"
    sf.write(slow, np.zeros(8000, np.float32), 8000)
    with pytest.raises(og.GenaiRuntimeError, match=r"8000 Hz is below the model's 16000 Hz"):
        processor(PROMPT, audios=og.Audios.open(slow))

    generator = og.Generator(model, og.GeneratorParams(model))
    with pytest.raises(og.GenaiRuntimeError, match=r"encoder\.onnx needs input 'audio_features'"):
        generator.append_tokens(reference_features["input_ids"])
    wrong = np.zeros((2, 80, 3000), np.float32)
    with pytest.raises(
        og.GenaiRuntimeError, match=r"'audio_features' has batch 2 .* batch_size is 1"
    ):
        generator.set_model_input("audio_features", wrong)
    with pytest.raises(og.GenaiRuntimeError, match=r"expects 3000 on axis 2"):
        generator.set_model_input("audio_features", np.zeros((1, 80, 100), np.float32))
    generator.set_inputs(dict(reference_features))  # still usable
    (row,) = _run(generator)
    assert row == golden["output_ids"]


def test_cli_run_transcribes_an_audio_file(
    whisper_dir: Path, jfk: Path, golden: dict, capsys
) -> None:
    from genai_runtime.cli import main

    assert main(["run", str(whisper_dir), "--audio", str(jfk)]) == 0
    assert capsys.readouterr().out.strip() == golden["text"].strip()


def built_model(name: str) -> Path:
    """A model from the background builds (env GENAI_RUNTIME_MODELS); skipped when absent."""
    import os

    root = Path(os.environ.get("GENAI_RUNTIME_MODELS", "~/genai-models/onnx")).expanduser()
    if not (root / name / "genai_config.json").is_file():
        pytest.skip(f"{root / name} not built (optional model)")
    return root / name


def test_fp32_whisper_build_equals_the_reference(jfk: Path, second_clip: Path) -> None:
    ref_og = pytest.importorskip("onnxruntime_genai")
    folder = built_model("whisper-tiny.en-fp32")
    paths = [str(jfk), str(second_clip)]
    ref_model = ref_og.Model(str(folder))
    ref_params = ref_og.GeneratorParams(ref_model)
    ref_params.set_search_options(do_sample=False, batch_size=2, max_length=448)
    ref_gen = ref_og.Generator(ref_model, ref_params)
    ref_processor = ref_model.create_multimodal_processor()
    ref_gen.set_inputs(ref_processor([PROMPT] * 2, audios=ref_og.Audios.open(*paths)))
    while not ref_gen.is_done():
        ref_gen.generate_next_token()
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(batch_size=2)
    generator = og.Generator(model, params)
    generator.set_inputs(
        model.create_multimodal_processor()([PROMPT] * 2, audios=og.Audios.open(*paths))
    )
    rows = _run(generator)
    assert rows == [ref_gen.get_sequence(i).tolist() for i in range(2)]
