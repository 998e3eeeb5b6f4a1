"""Cache kinds on a device, run under copy-on-bind emulation (a CPU session that copies every
bound host input, as a GPU's provider does). Those whose graph writes its own buffers
(static-scatter, graph-scattered) and the fixed-shape kinds (static-index-copy, static-fifo:
the graph returns only the new rows, a small graph on the same provider writes them into the
buffers) keep device tensors made there and bound once at fixed addresses; the logits of every
step equal a NumPy recompute with no cache, greedy tokens equal the host's, and a decode step
allocates nothing there and brings back only the chosen ids. A kind whose rows host code
writes (sliding-window) is refused on a device before any generation."""

from __future__ import annotations

import json

import layouts as L
import numpy as np
import pytest

import genai_runtime as og
from genai_runtime.errors import GenerationError
from genai_runtime.explain import explain_model, format_report
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
    params.set_search_options(**{"max_length": L.CAPACITY, **options})
    return og.Generator(model, params)


def _padded(prompts: list[list[int]]) -> np.ndarray:
    width = max(map(len, prompts))
    return np.array([p + [L.PAD] * (width - len(p)) for p in prompts], np.int64)


def _check_steps(generator: og.Generator, prompts: list[list[int]], w, steps: int,
                 window: int | None = None) -> None:  # fmt: skip
    width = max(map(len, prompts))
    for _ in range(steps):
        logits = generator.get_logits()[:, 0]
        for b, prompt in enumerate(prompts):
            tokens = prompt + generator.get_sequence(b)[width:].tolist()
            ref = L.reference_logits(tokens, w, window)[-1]
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


def test_a_kind_whose_rows_the_host_writes_is_refused_on_a_device(tmp_path, w) -> None:
    folder = L.folder(tmp_path, "share-buffer", w, window=4, window_layers=[0], cache_slack=2)
    model = _device_model(folder)
    with pytest.raises(og.UnsupportedError, match=r"sliding-window cache .* cannot live on"):
        _generator(model)


# -- fixed-shape kinds: the runtime writes each chunk's new rows, on the device --------------


def _greedy(folder, prompts, device: bool, steps: int, measured: int = 0, **options):
    """Greedy (or seeded sampled) rows, and the census of the last ``measured`` steps."""
    model = _device_model(folder) if device else og.Model(folder)
    generator = _generator(model, batch_size=len(prompts), **options)
    generator.append_tokens(_padded(prompts))
    for _ in range(steps - measured):
        generator.generate_next_token()
    with measure() as m:
        for _ in range(measured):
            generator.generate_next_token()
    return generator, [generator.get_sequence(b).tolist() for b in range(len(prompts))], m


@pytest.mark.parametrize("layout", L.FIXED_SHAPE)
@pytest.mark.parametrize("batch", [1, 3])
def test_fixed_shape_caches_on_a_device_give_the_host_tokens(tmp_path, w, layout, batch) -> None:
    """Greedy ids chosen on the device (right-padded batch 3: rows end in different chunks of
    the prompt) equal the host's; the buffers never move; the logits equal the recompute."""
    folder = L.folder(tmp_path, layout, w)
    prompts = PROMPTS[:batch]
    steps = L.CAPACITY - max(map(len, prompts)) - 1
    generator, _, _ = _greedy(folder, prompts, True, 3)
    cache = generator.kv_cache
    assert generator.kv_plan.kind == layout and not cache._device.host
    addresses = [v.data_ptr() for v in cache._values]
    for _ in range(steps - 3):
        generator.generate_next_token()
    assert [v.data_ptr() for v in cache._values] == addresses  # written in place
    ours = [generator.get_sequence(b).tolist() for b in range(batch)]
    assert ours == _greedy(folder, prompts, False, steps)[1]
    generator = _generator(_device_model(folder), batch_size=batch)
    generator.append_tokens(_padded(prompts))
    _check_steps(generator, prompts, w, 8)  # the rows the device kept, copied out


@pytest.mark.parametrize("layout", L.FIXED_SHAPE)
@pytest.mark.parametrize("batch", [1, 3])
def test_a_fixed_shape_decode_step_on_a_device_allocates_nothing(tmp_path, w, layout, batch):
    """After the first step, per step: the graph's inputs go in (ids, its position input, the
    mask), the index-copy write graph's [B, 2] row counts (the FIFO's shift repeats: not
    copied); nothing is made there; only the chosen ids come back. Four runs: the model, the
    write graph, the last-row pick, the ArgMax."""
    rows, steps = batch, 4
    _, _, m = _greedy(L.folder(tmp_path, layout, w), PROMPTS[:batch], True, 8, measured=steps)
    census, chunk = m.census, rows * L.CHUNK * 8
    assert census.device_allocations == 0
    assert census.session_runs == 4 * steps
    mask = rows * (L.CAPACITY + L.CHUNK) * 8
    if layout == "static-index-copy":
        assert census.host_to_device == 4 * steps  # ids, cache_position, mask, row counts
        assert census.host_to_device_bytes == steps * (2 * chunk + mask + rows * 2 * 8)
    else:
        assert census.host_to_device == 3 * steps  # ids, position_ids, mask
        assert census.host_to_device_bytes == steps * (2 * chunk + mask)
    assert census.device_to_host == steps  # the chosen ids, int64 [B]
    assert census.device_to_host_bytes == steps * rows * 8


@pytest.mark.parametrize("layout", L.FIXED_SHAPE)
def test_fixed_shape_sampling_on_a_device_draws_the_host_tokens(tmp_path, w, layout) -> None:
    """Top-k sampling takes each row's k best logits on the device: the seeded draw is the
    host's, and only k values and ids per row come back."""
    folder = L.folder(tmp_path, layout, w)
    options = dict(do_sample=True, top_k=8, temperature=1.3, random_seed=7)
    _, ours, m = _greedy(folder, PROMPTS, True, 10, measured=4, **options)
    assert ours == _greedy(folder, PROMPTS, False, 10, **options)[1]
    assert m.census.device_allocations == 0
    assert m.census.device_to_host == 2 * 4  # values and ids
    assert m.census.device_to_host_bytes == 4 * 3 * 8 * (4 + 8)


def test_static_fifo_on_a_device_slides_past_its_context_and_rewinds(tmp_path, w) -> None:
    """Past the context the device FIFO drops its oldest rows (each token sees the last ctx
    positions); a rewind before that slides the kept rows back to the last slots there."""
    ctx = 8
    folder = L.folder(tmp_path, "static-fifo", w, ctx=ctx)
    for batch in (1, 3):
        prompts = PROMPTS[:batch]
        generator = _generator(_device_model(folder), batch_size=batch)
        generator.append_tokens(_padded(prompts))
        _check_steps(generator, prompts, w, 4, window=ctx + 1)
        generator.rewind_to(generator.token_count() - 3)
        _check_steps(generator, prompts, w, 10, window=ctx + 1)
        assert generator.kv_cache.evicted


def test_static_index_copy_on_a_device_rewinds_and_keeps_its_context_limit(tmp_path, w) -> None:
    ctx = 8
    generator = _generator(_device_model(L.folder(tmp_path, "static-index-copy", w, ctx=ctx)),
                           batch_size=3)  # fmt: skip
    generator.append_tokens(_padded(PROMPTS))
    _check_steps(generator, PROMPTS, w, 3)  # row 0 now holds 8 rows: the context is full
    generator.generate_next_token()
    with pytest.raises(GenerationError, match=r"after 8 \(row 0\) exceed .* of 8"):
        generator.get_logits()
    generator.rewind_to(6)
    _check_steps(generator, PROMPTS, w, 2)


@pytest.mark.parametrize("layout", L.FIXED_SHAPE)
def test_fixed_shape_beam_search_on_a_device_gives_the_host_beams(tmp_path, w, layout) -> None:
    folder = L.folder(tmp_path, layout, w)
    rows = []
    for device in (False, True):
        generator, _, _ = _greedy(folder, PROMPTS[:1], device, 0, num_beams=3,
                                  num_return_sequences=3, max_length=14)  # fmt: skip
        while not generator.is_done():
            generator.generate_next_token()
        rows.append([generator.get_sequence(i).tolist() for i in range(3)])
    assert rows[1] == rows[0]


@pytest.mark.parametrize("layout", L.FIXED_SHAPE)
def test_explain_places_a_fixed_shape_cache_on_the_device(tmp_path, w, layout) -> None:
    report = explain_model(_device_model(L.folder(tmp_path, layout, w)))
    assert report["graphs"]["kv_cache"]["device_obstacle"] is None
    text = format_report(report)
    assert "lives on:  cpu (copy on bind) (past buffers bound once; each chunk's new" in text
