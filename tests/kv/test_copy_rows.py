"""Copying a prompt's keys/values out of one generator and into another (``read_kv`` /
``append_kv``, what ``run --prompt-cache`` uses) on every layout of the tiny decoder: a kind that
declares ``can_copy_rows`` gives the same logits and greedy tokens as running the whole prompt;
the others, and generators that keep state besides the cache, refuse and say why."""

from __future__ import annotations

import json

import layouts as L
import numpy as np
import pytest

import genai_runtime as og
from genai_runtime.errors import GenerationError, UnsupportedError
from genai_runtime.kv import CACHE_KINDS
from genai_runtime.session.device import COPY_ON_BIND

PROMPT = [5, 9, 3, 7, 12, 4, 8, 6, 2, 11]
CUT = 7  # positions copied; the last three tokens are run


@pytest.fixture(scope="module")
def w() -> dict[str, np.ndarray]:
    return L.weights()


@pytest.fixture(scope="module")
def models(tmp_path_factory, w) -> dict[str, og.Model]:
    root = tmp_path_factory.mktemp("copy-rows")
    return {layout: og.Model(L.folder(root, layout, w)) for layout in L.LAYOUTS}


def _generator(model: og.Model, **options) -> og.Generator:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=20, **options)
    return og.Generator(model, params)


def _greedy(generator: og.Generator, steps: int = 6) -> tuple[list[int], list[np.ndarray]]:
    tokens, logits = [], []
    for _ in range(steps):
        logits.append(generator.get_logits()[0, 0].copy())
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokens, logits


@pytest.mark.parametrize("layout", [k for k in L.LAYOUTS if CACHE_KINDS[k].can_copy_rows])
def test_copied_rows_give_the_logits_of_running_the_prompt(models, w, layout) -> None:
    model = models[layout]
    plain = _generator(model)
    plain.append_tokens(np.array([PROMPT]))
    rows = plain.read_kv(0, len(PROMPT))
    want_tokens, want_logits = _greedy(plain)

    dtype, (tensors, heads, size) = plain.kv_rows
    assert rows.shape == (tensors, heads, len(PROMPT), size) and rows.dtype == dtype
    assert tensors == 2 * L.LAYERS and heads == L.KV_HEADS and size == L.HEAD
    np.testing.assert_array_equal(plain.read_kv(2, 5), rows[:, :, 2:5])  # positions stay put

    cached = _generator(model)
    cached.append_kv(np.array(PROMPT[:CUT]), rows[:, :, :CUT])
    assert cached.token_count() == CUT
    np.testing.assert_array_equal(cached.read_kv(0, CUT), rows[:, :, :CUT])
    with pytest.raises(GenerationError, match="append_tokens next"):
        cached.generate_next_token()  # copied rows bring no logits
    cached.append_tokens(np.array([PROMPT[CUT:]]))
    tokens, logits = _greedy(cached)
    assert tokens == want_tokens
    for got, want in zip(logits, want_logits):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert cached.get_sequence(0).tolist() == plain.get_sequence(0).tolist()
    full = L.reference_logits(PROMPT, w)[-1]
    np.testing.assert_allclose(want_logits[0], full, atol=1e-4, rtol=0)


@pytest.mark.parametrize("layout", [k for k in L.LAYOUTS if not CACHE_KINDS[k].can_copy_rows])
def test_kinds_that_cannot_copy_say_why(models, layout) -> None:
    generator = _generator(models[layout])
    generator.append_tokens(np.array([PROMPT]))
    why = generator.kv_copy_obstacle
    assert why is not None and layout in why and CACHE_KINDS[layout].cannot_copy in why
    with pytest.raises(UnsupportedError, match="cannot copy keys/values"):
        generator.read_kv(0, 2)


def test_sliding_window_cannot_copy(tmp_path, w) -> None:
    folder = L.folder(tmp_path, "share-buffer", w, window=4, window_layers=[0], cache_slack=2)
    generator = _generator(og.Model(folder))
    assert generator.kv_plan.kind == "sliding-window"
    assert "rotates in place" in generator.kv_copy_obstacle


def test_rows_are_refused_where_they_do_not_fit(models) -> None:
    model = models["share-buffer"]
    batch = _generator(model, batch_size=2)
    assert "batch size 1" in batch.kv_copy_obstacle
    with pytest.raises(UnsupportedError, match="batch size 1"):
        batch.append_kv(np.array([[1, 2], [3, 4]]), np.zeros((4, 2, 2, 8), np.float32))
    generator = _generator(model)
    generator.append_tokens(np.array([PROMPT]))
    with pytest.raises(GenerationError, match="not held"):
        generator.read_kv(0, len(PROMPT) + 1)
    with pytest.raises(GenerationError, match="rewind_to"):
        generator.append_kv(np.array([1, 2]), generator.read_kv(0, 2))
    generator.rewind_to(0)
    with pytest.raises(GenerationError, match="do not fit"):
        generator.append_kv(np.array([1, 2]), np.zeros((4, 2, 2, 4), np.float32))
    with pytest.raises(GenerationError, match="do not hold 3 positions"):
        generator.append_kv(np.array([1, 2, 3]), np.zeros((4, 2, 2, 8), np.float32))
    assert generator.token_count() == 0  # nothing refused above changed it


def test_the_combined_gpt2_layout_copies_keys_and_values_apart(gpt2_dir) -> None:
    model = og.Model(str(gpt2_dir))
    prompt = np.array([[11, 22, 33, 44, 55, 66, 77, 88]])
    plain = _generator(model)
    plain.append_tokens(prompt)
    rows = plain.read_kv(0, prompt.shape[1])
    assert plain.kv_plan.layout.format == "combined"
    assert rows.shape[0] == 2 * plain.kv_plan.layout.num_layers  # [2, B, H, S, D] split
    cached = _generator(model)
    cached.append_kv(prompt[0, :5], rows[:, :, :5])
    cached.append_tokens(prompt[:, 5:])
    assert _greedy(cached)[0] == _greedy(plain)[0]


@pytest.mark.parametrize("layout", ["concat", "share-buffer", "static-scatter", "graph-scattered"])
def test_on_a_device_concat_copies_through_the_host_and_the_others_refuse(tmp_path, w, layout):
    """Copy-on-bind emulation: a CPU session that copies bound inputs, as a GPU's provider."""
    config = og.Config(L.folder(tmp_path, layout, w))
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {COPY_ON_BIND: "1"}}}}))
    model = og.Model(config)
    plain = _generator(model)
    plain.append_tokens(np.array([PROMPT]))
    if layout != "concat":
        assert "rows are copied on the host" in plain.kv_copy_obstacle
        return
    rows = plain.read_kv(0, len(PROMPT))
    cached = _generator(model)
    cached.append_kv(np.array(PROMPT[:CUT]), rows[:, :, :CUT])
    cached.append_tokens(np.array([PROMPT[CUT:]]))
    assert _greedy(cached)[0] == _greedy(plain)[0]
