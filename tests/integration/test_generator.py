"""Generator behaviour on real models: rewind for every cache kind, multi-turn cache reuse,
batch EOS handling, logits access, and bad input that leaves the generator usable."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import require_shared

import genai_runtime as og
from genai_runtime.errors import GenaiRuntimeError, GenerationError, ModelError

PROMPT = [504, 1398, 282, 5574, 42, 11977, 28, 21285, 28]  # "The list of fruits: apple, banana,"


@functools.cache
def smollm2_2layers() -> og.Model:
    return og.Model(require_shared("models", "smollm2-135m-instruct-int4-2layers"))


@functools.cache
def gpt2() -> og.Model:
    return og.Model(require_shared("fixtures", "onnxruntime-genai", "tiny-random-gpt2-fp32"))


@functools.cache
def pipeline() -> og.Model:
    """Three sessions (embeddings -> transformer -> lm_head) chained by wires."""
    return og.Model(require_shared("fixtures", "onnxruntime-genai", "pipeline-model-tiny"))


def _generator(model: og.Model, **options) -> og.Generator:
    params = og.GeneratorParams(model)
    params.set_search_options(**options)
    return og.Generator(model, params)


def _run(generator: og.Generator, steps: int) -> list[int]:
    for _ in range(steps):
        generator.generate_next_token()
    return generator.get_sequence(0).tolist()


# (model, options, expected cache kind): every cache kind the runtime has.
CACHES = [
    pytest.param(smollm2_2layers, {"past_present_share_buffer": True}, "share-buffer", id="share"),
    pytest.param(smollm2_2layers, {"past_present_share_buffer": False}, "concat", id="concat"),
    pytest.param(gpt2, {}, "concat", id="combined-gpt2"),
    pytest.param(pipeline, {}, "concat", id="three-stage-pipeline"),
]


@pytest.mark.parametrize(("model", "options", "kind"), CACHES)
def test_rewind_then_regenerate_matches_fresh_run(model, options, kind) -> None:
    prompt = PROMPT if model is smollm2_2layers else [1, 2, 3, 4, 5]

    def fresh_run(tokens: list[int], steps: int) -> list[int]:
        fresh = _generator(model(), max_length=40, **options)
        assert fresh.kv_cache.kind == kind
        fresh.append_tokens(tokens)
        return _run(fresh, steps)

    expected = fresh_run(prompt, 20)
    generator = _generator(model(), max_length=40, **options)
    generator.append_tokens(prompt)
    _run(generator, 20)
    for keep in (len(prompt) + 7, len(prompt), len(prompt) + 1):
        generator.rewind_to(keep)
        assert generator.token_count() == keep
        assert generator.get_sequence(0).tolist() == expected[:keep]
        assert _run(generator, len(expected) - keep) == expected
    # Into the prompt: the continuation is whatever a fresh run on that prefix gives.
    generator.rewind_to(3)
    assert _run(generator, 10) == fresh_run(prompt[:3], 10)
    generator.rewind_to(0)
    generator.append_tokens(prompt)
    assert _run(generator, 20) == expected


@pytest.mark.parametrize(("model", "options", "kind"), CACHES)
def test_multi_turn_reuses_cache_and_matches_full_prefill(model, options, kind) -> None:
    first, second = (
        ([5574, 42, 11977], [28, 21285, 28])
        if model is smollm2_2layers
        else ([1, 2, 3], [7, 8, 9, 10])
    )
    generator = _generator(model(), max_length=40, **options)
    generator.append_tokens(first)
    _run(generator, 4)
    cached = generator.kv_cache.length
    assert cached == len(first) + 3  # the 4th token is generated but not yet run
    generator.append_tokens(second)
    # Only the pending token and the new ones went through the model.
    assert generator.kv_cache.length == cached + 1 + len(second)
    turn_two = generator.get_logits()[0, 0]

    whole = _generator(model(), max_length=40, **options)
    whole.append_tokens(generator.get_sequence(0))
    reference = whole.get_logits()[0, 0]
    np.testing.assert_allclose(turn_two, reference, atol=1e-3)
    assert int(turn_two.argmax()) == int(reference.argmax())


def test_batch_rows_finishing_early_are_padded() -> None:
    model = smollm2_2layers()
    generator = _generator(model, max_length=20, batch_size=2)
    generator.append_tokens(np.array([PROMPT[:5], PROMPT[:5]]))
    eos, pad = model.spec.tokens.eos[0], model.spec.tokens.pad
    logits = np.zeros((2, model.vocab_size), np.float32)
    logits[0, eos] = 10.0
    logits[1, 7] = 10.0
    generator.set_logits(logits)
    generator.generate_next_token()
    assert generator.get_next_tokens().tolist() == [eos, 7]
    assert not generator.is_done()
    generator.generate_next_token()
    assert generator.get_next_tokens()[0] == pad
    while not generator.is_done():
        generator.generate_next_token()
    assert generator.token_count() == 20
    assert set(generator.get_sequence(0)[6:].tolist()) == {pad}


def test_logits_shape_and_set_logits() -> None:
    model = smollm2_2layers()
    generator = _generator(model, max_length=20)
    generator.append_tokens(PROMPT)
    logits = generator.get_logits()
    assert logits.shape == (1, 1, model.vocab_size)
    forced = np.full(model.vocab_size, -1.0, np.float32)
    forced[123] = 5.0
    generator.set_logits(forced)
    generator.generate_next_token()
    assert generator.get_next_tokens().tolist() == [123]
    # Outputs are the last run's: the prompt pass, until the next token is run.
    assert generator.get_output("logits").shape == (1, len(PROMPT), model.vocab_size)
    generator.generate_next_token()
    assert generator.get_output("logits").shape == (1, 1, model.vocab_size)


def test_is_done_at_max_length_and_generate_past_it_fails() -> None:
    generator = _generator(smollm2_2layers(), max_length=len(PROMPT) + 3)
    generator.append_tokens(PROMPT)
    assert not generator.is_done()
    count = 0
    while not generator.is_done():
        generator.generate_next_token()
        count += 1
    assert count == 3
    with pytest.raises(GenerationError, match="max_length"):
        generator.generate_next_token()


def test_iterator_yields_tokens_until_done() -> None:
    generator = _generator(smollm2_2layers(), max_length=len(PROMPT) + 5)
    generator.append_tokens(PROMPT)
    tokens = list(generator)
    assert tokens == generator.get_sequence(0)[len(PROMPT) :].tolist()
    assert len(tokens) == 5


# -- bad input -------------------------------------------------------------------------------


def test_prompt_longer_than_max_length_is_refused_and_generator_stays_usable() -> None:
    generator = _generator(smollm2_2layers(), max_length=8)
    with pytest.raises(GenerationError, match="exceed max_length 8"):
        generator.append_tokens(PROMPT)
    assert generator.token_count() == 0
    generator.append_tokens(PROMPT[:4])
    expected = _generator(smollm2_2layers(), max_length=8)
    expected.append_tokens(PROMPT[:4])
    assert _run(generator, 4) == _run(expected, 4)


def test_token_id_outside_vocabulary_is_refused_and_generator_stays_usable() -> None:
    model = smollm2_2layers()
    generator = _generator(model, max_length=30)
    generator.append_tokens(PROMPT)
    with pytest.raises(GenerationError, match=rf"token id {model.vocab_size} .*\[0, 49152\)"):
        generator.append_tokens([1, model.vocab_size])
    with pytest.raises(GenerationError, match="token id -1"):
        generator.append_tokens([-1])
    fresh = _generator(model, max_length=30)
    fresh.append_tokens(PROMPT)
    assert _run(generator, 5) == _run(fresh, 5)


def test_calls_out_of_order_are_clear_errors() -> None:
    generator = _generator(smollm2_2layers(), max_length=30)
    with pytest.raises(GenerationError, match="append_tokens"):
        generator.generate_next_token()
    with pytest.raises(GenerationError, match="rewind"):
        generator.rewind_to(3)
    with pytest.raises(GenerationError, match="unknown search option 'top_q'"):
        og.GeneratorParams(smollm2_2layers()).set_search_options(top_q=0.5)
    with pytest.raises(GenerationError, match="top_k: expected an integer"):
        og.GeneratorParams(smollm2_2layers()).set_search_options(top_k=1.5)


def test_beam_search_with_sampling_is_refused_clearly() -> None:
    params = og.GeneratorParams(smollm2_2layers())
    params.set_search_options(num_beams=4, do_sample=True, top_k=5)
    with pytest.raises(og.GenerationError, match="cannot be used with a beam search"):
        og.Generator(smollm2_2layers(), params)


def _copy_model(tmp_path: Path) -> Path:
    source = require_shared("models", "smollm2-135m-instruct-int4-2layers")
    target = tmp_path / "model"
    shutil.copytree(source, target, copy_function=shutil.copyfile)  # copies, never hard links
    return target


def test_missing_onnx_file_names_the_file(tmp_path: Path) -> None:
    folder = _copy_model(tmp_path)
    (folder / "model.onnx").unlink()
    with pytest.raises(ModelError, match=r"model file not found: .*model\.onnx"):
        og.Model(folder)


def test_corrupt_onnx_file_names_the_file(tmp_path: Path) -> None:
    folder = _copy_model(tmp_path)
    (folder / "model.onnx").write_bytes(b"this is not a protobuf" * 10)
    with pytest.raises(ModelError, match=r"cannot load .*model\.onnx"):
        og.Model(folder)


def test_missing_external_data_names_the_file(tmp_path: Path) -> None:
    folder = _copy_model(tmp_path)
    (folder / "model.onnx.data").unlink()
    with pytest.raises(ModelError, match=r"model\.onnx"):
        og.Model(folder)


def test_config_input_name_the_graph_lacks_names_file_and_tensor(tmp_path: Path) -> None:
    folder = _copy_model(tmp_path)
    config = (folder / "genai_config.json").read_text()
    (folder / "genai_config.json").write_text(
        config.replace('"attention_mask": "attention_mask"', '"attention_mask": "attn"')
    )
    with pytest.raises(ModelError, match=r"model\.onnx.*'attention_mask' to 'attn'"):
        og.Model(folder)


def test_every_deliberate_error_is_a_genai_runtime_error() -> None:
    for cls in (GenerationError, ModelError, og.ConfigError, og.UnsupportedError, og.TrustError):
        assert issubclass(cls, GenaiRuntimeError)
        assert issubclass(cls, RuntimeError)  # what onnxruntime-genai's bindings raise


def test_seeded_sampling_is_reproducible() -> None:
    model = smollm2_2layers()

    def sampled(seed: int) -> list[int]:
        generator = _generator(
            model, max_length=40, do_sample=True, top_k=50, temperature=1.5, random_seed=seed
        )
        generator.append_tokens(PROMPT)
        return _run(generator, 25)

    assert sampled(7) == sampled(7)
    assert sampled(7) != sampled(8)


def test_set_logits_keeps_the_cache_consistent_with_the_sequence() -> None:
    model = smollm2_2layers()
    generator = _generator(model, max_length=30)
    generator.append_tokens(PROMPT)
    generator.generate_next_token()  # its token is not run yet
    forced = np.full(model.vocab_size, -1.0, np.float32)
    forced[123] = 5.0
    generator.set_logits(forced)  # replaces the forward pass of that pending token
    generator.generate_next_token()
    logits = generator.get_logits()[0, 0]  # runs both unrun tokens
    assert generator.kv_cache.length == len(PROMPT) + 2

    fresh = _generator(model, max_length=30)
    fresh.append_tokens(generator.get_sequence(0))
    np.testing.assert_allclose(logits, fresh.get_logits()[0, 0], atol=1e-3)


def test_generators_sharing_a_model_do_not_interfere() -> None:
    model = smollm2_2layers()
    alone = _generator(model, max_length=30)
    alone.append_tokens(PROMPT)
    expected = _run(alone, 12)
    a, b = _generator(model, max_length=30), _generator(model, max_length=30)
    a.append_tokens(PROMPT)
    b.append_tokens(PROMPT[:4])
    for _ in range(12):
        a.generate_next_token()
        b.generate_next_token()
    assert a.get_sequence(0).tolist() == expected
