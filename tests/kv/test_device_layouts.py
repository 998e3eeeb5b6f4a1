"""Cache kinds whose graph writes its own buffers (static-scatter, graph-scattered) on a device,
run under copy-on-bind emulation (a CPU session that copies every bound host input, as a GPU's
provider does): the buffers are device tensors made there, bound once at fixed addresses, and
the logits of every step equal a NumPy recompute with no cache. Kinds whose rows the runtime
writes with host code are refused on a device before any generation."""

from __future__ import annotations

import json

import layouts as L
import numpy as np
import pytest

import genai_runtime as og
from genai_runtime.session.census import measure
from genai_runtime.session.device import COPY_ON_BIND

COPY = {"model": {"decoder": {"session_options": {COPY_ON_BIND: "1"}}}}
PROMPTS = [[5, 9, 3, 7, 12], [4, 8], [6, 2, 11, 13]]
IN_PLACE = ("static-scatter", "graph-scattered")


@pytest.fixture(scope="module")
def w() -> dict[str, np.ndarray]:
    return L.weights()


def _device_model(folder) -> og.Model:
    config = og.Config(folder)
    config.overlay(json.dumps(COPY))
    return og.Model(config)


def _generator(model: og.Model, **options) -> og.Generator:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=L.CAPACITY, **options)
    return og.Generator(model, params)


def _padded(prompts: list[list[int]]) -> np.ndarray:
    width = max(map(len, prompts))
    return np.array([p + [L.PAD] * (width - len(p)) for p in prompts], np.int64)


def _check_steps(generator: og.Generator, prompts: list[list[int]], w, steps: int) -> None:
    width = max(map(len, prompts))
    for _ in range(steps):
        logits = generator.get_logits()[:, 0]
        for b, prompt in enumerate(prompts):
            tokens = prompt + generator.get_sequence(b)[width:].tolist()
            ref = L.reference_logits(tokens, w)[-1]
            np.testing.assert_allclose(logits[b], ref, atol=1e-4, rtol=0)
        generator.generate_next_token()


@pytest.mark.parametrize("layout", IN_PLACE)
@pytest.mark.parametrize("batch", [1, 3])
def test_in_place_caches_on_a_device_equal_the_recompute(tmp_path, w, layout, batch) -> None:
    generator = _generator(_device_model(L.folder(tmp_path, layout, w)), batch_size=batch)
    cache = generator.kv_cache
    assert generator.kv_plan.kind == layout and not cache._device.host
    prompts = PROMPTS[:batch]
    generator.append_tokens(_padded(prompts))
    _check_steps(generator, prompts, w, 3)
    addresses = [v.data_ptr() for v in cache._values]
    _check_steps(generator, prompts, w, 6)
    assert [v.data_ptr() for v in cache._values] == addresses  # written in place, never moved
    generator.rewind_to(generator.token_count() - 4)
    _check_steps(generator, prompts, w, 4)


@pytest.mark.parametrize("layout", IN_PLACE)
def test_an_in_place_decode_step_on_a_device_allocates_nothing(tmp_path, w, layout) -> None:
    generator = _generator(_device_model(L.folder(tmp_path, layout, w)))
    generator.append_tokens(PROMPTS[0])
    for _ in range(3):
        generator.generate_next_token()
    with measure() as m:
        for _ in range(4):
            generator.generate_next_token()
    assert m.census.device_allocations == 0
    assert m.census.device_to_host == 4 and m.census.device_to_host_bytes == 4 * 8  # the ids


@pytest.mark.parametrize("layout", IN_PLACE)
def test_beam_search_on_a_device_moves_the_rows_there(tmp_path, w, layout) -> None:
    folder = L.folder(tmp_path, layout, w)
    rows = []
    for model in (og.Model(folder), _device_model(folder)):
        generator = _generator(model, num_beams=3, num_return_sequences=3)
        generator.append_tokens(PROMPTS[0])
        while not generator.is_done():
            generator.generate_next_token()
        rows.append([generator.get_sequence(i).tolist() for i in range(3)])
    assert rows[1] == rows[0]


@pytest.mark.parametrize("layout", L.FIXED_SHAPE)
def test_a_kind_whose_rows_the_host_writes_is_refused_on_a_device(tmp_path, w, layout) -> None:
    model = _device_model(L.folder(tmp_path, layout, w))
    with pytest.raises(og.UnsupportedError, match=rf"{layout} cache .* cannot live on"):
        _generator(model)
