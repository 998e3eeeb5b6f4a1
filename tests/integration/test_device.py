"""The device code path, run on the CPU provider.

A GPU's execution provider copies a host input when it is bound; a loop that binds host buffers
once and rewrites them in place is right on the CPU provider and silently wrong there. The session
config entry ``genai_runtime.copy_on_bind`` gives a CPU session exactly that behaviour (every
host input bound as a private copy, every cache tensor moved by a Gather graph on the provider),
so this code path runs here and must give the CPU path's tokens. The GPU itself is checked by
``tests/integration/test_gpu.py`` (skipped without one).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import genai_runtime as og
from genai_runtime.cli import main
from genai_runtime.kv.base import KVLayout
from genai_runtime.kv.share_buffer import ShareBufferCache
from genai_runtime.session.census import measure
from genai_runtime.session.device import COPY_ON_BIND, Device, graph_take, parse_device

COPY = {"model": {"decoder": {"session_options": {COPY_ON_BIND: "1"}}}}
CONCAT = {"search": {"past_present_share_buffer": False}}


def _model(folder: Path, *overlays: dict) -> og.Model:
    config = og.Config(folder)
    for overlay in overlays:
        config.overlay(json.dumps(overlay))
    return og.Model(config)


def _generate(model: og.Model, prompts: list[list[int]], new: int, rewind: int | None = None):
    """Greedy rows (EOS held off); with ``rewind``, generate ``new`` tokens, go back to
    ``rewind`` tokens past the prompt and generate ``new`` again."""
    width = max(len(p) for p in prompts)
    params = og.GeneratorParams(model)
    total = width + 2 * new
    params.set_search_options(max_length=total, min_length=total, batch_size=len(prompts))
    generator = og.Generator(model, params)
    pad = model.spec.tokens.pad or 0
    generator.append_tokens(np.array([p + [pad] * (width - len(p)) for p in prompts]))
    for _ in range(new):
        generator.generate_next_token()
    if rewind is not None:
        generator.rewind_to(width + rewind)
        for _ in range(new):
            generator.generate_next_token()
    return generator, [generator.get_sequence(i).tolist() for i in range(len(prompts))]


PROMPT = [1, 504, 3458, 314, 260, 3575, 282, 4649, 47]  # "The capital of France is" in a chat


@pytest.mark.parametrize("cache", ["share-buffer", "concat"])
def test_copy_on_bind_gives_the_cpu_tokens(smollm2_dir: Path, cache: str) -> None:
    """The whole model: its next token depends on every input (the 2-layer cut does not, so
    it would not notice an input left stale)."""
    overlays = [CONCAT] if cache == "concat" else []
    plain = _model(smollm2_dir, *overlays)
    device = _model(smollm2_dir, *overlays, COPY)
    prompts = [PROMPT, PROMPT[:4]]  # uneven: right padding in a batch of two
    for rows, rewind in (([PROMPT], 2), (prompts, None)):
        gen, ours = _generate(device, rows, 4, rewind)
        assert gen.kv_plan.kind == cache and not gen.kv_cache.device.host
        assert ours == _generate(plain, rows, 4, rewind)[1]


def _greedy(model: og.Model, prompts: list[list[int]], steps: int, measured: int = 0):
    """Plain greedy rows (no op before the argmax, so the device takes it); the census of the
    last ``measured`` steps."""
    width = max(len(p) for p in prompts)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=width + steps, batch_size=len(prompts))
    generator = og.Generator(model, params)
    pad = model.spec.tokens.pad or 0
    generator.append_tokens(np.array([p + [pad] * (width - len(p)) for p in prompts]))
    for _ in range(steps - measured):
        generator.generate_next_token()
    with measure() as m:
        for _ in range(measured):
            generator.generate_next_token()
    return generator, [generator.get_sequence(i).tolist() for i in range(len(prompts))], m


STORY = [6403, 1980, 253, 655, 28, 281, 253, 1165, 6560, 28]  # "Once upon a time, in a small..."
COLOURS = [504, 1296, 3003, 4683, 359]  # "The three primary colors are"
CODE = [1604, 3987, 46477, 24, 94, 727]  # "def fibonacci(n):" (no EOS in 16 greedy tokens)
BATCHES = {"batch 1": [STORY], "right-padded 3": [STORY, COLOURS, CODE]}


@pytest.mark.parametrize("cache", ["share-buffer", "concat"])
@pytest.mark.parametrize("batch", list(BATCHES))
def test_device_greedy_choice_gives_the_cpu_tokens(smollm2_dir: Path, cache: str, batch: str):
    overlays = [CONCAT] if cache == "concat" else []
    prompts = BATCHES[batch]
    gen, ours, _ = _greedy(_model(smollm2_dir, *overlays, COPY), prompts, 12)
    assert gen.kv_plan.kind == cache and not gen.kv_cache.device.host
    assert ours == _greedy(_model(smollm2_dir, *overlays), prompts, 12)[1]


def _sampled(model: og.Model, prompts: list[list[int]], steps: int, measured: int = 0):
    """Seeded top-k sampling rows; the census of the last ``measured`` steps."""
    width = max(len(p) for p in prompts)
    params = og.GeneratorParams(model)
    params.set_search_options(
        max_length=width + steps, batch_size=len(prompts), do_sample=True, top_k=8,
        temperature=1.3, top_p=0.9, random_seed=7,
    )  # fmt: skip
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([p + [0] * (width - len(p)) for p in prompts]))
    for _ in range(steps - measured):
        generator.generate_next_token()
    with measure() as m:
        for _ in range(measured):
            generator.generate_next_token()
    return [generator.get_sequence(i).tolist() for i in range(len(prompts))], m


@pytest.mark.parametrize("batch", list(BATCHES))
def test_device_top_k_sampling_draws_the_host_tokens_and_returns_only_candidates(
    smollm2_dir: Path, batch: str
) -> None:
    """Top-k sampling takes each row's k best logits on the device (TopK), so only k values
    and ids per row come back, and the seeded draw is the host's token for token."""
    prompts = BATCHES[batch]
    ours, m = _sampled(_model(smollm2_dir, COPY), prompts, 12, measured=4)
    assert ours == _sampled(_model(smollm2_dir), prompts, 12)[0]
    rows = len(prompts)
    assert m.census.device_allocations == 0
    assert m.census.device_to_host == 2 * 4  # values and ids
    assert m.census.device_to_host_bytes == 4 * rows * 8 * (4 + 8)


@pytest.mark.parametrize("batch", list(BATCHES))
def test_a_share_buffer_decode_step_allocates_nothing_and_moves_only_step_inputs(
    smollm2_dir: Path, batch: str
) -> None:
    """After the first step: no device tensor is made; the ids go in, and with padded rows the
    mask's buffer (each copied into the tensor bound last step; batch 1's mask is a prefix of
    a constant all-ones buffer copied once); only the chosen ids come back."""
    prompts = BATCHES[batch]
    rows, steps = len(prompts), 4
    max_length = max(len(p) for p in prompts) + 8
    gen, _, m = _greedy(_model(smollm2_dir, COPY), prompts, 8, measured=steps)
    assert gen.max_length == max_length
    census = m.census
    assert census.device_allocations == 0
    assert census.session_runs == 2 * steps  # the model and the argmax graph
    if rows == 1:
        assert census.host_to_device == steps  # input_ids alone
        assert census.host_to_device_bytes == steps * 8
    else:
        assert census.host_to_device == 2 * steps  # input_ids, the attention_mask buffer
        assert census.host_to_device_bytes == steps * (rows * 8 + rows * max_length * 8)
    assert census.device_to_host == steps  # the chosen ids, int64 [B]
    assert census.device_to_host_bytes == steps * rows * 8


def test_the_device_gather_graph_takes_what_numpy_takes() -> None:
    data = np.random.default_rng(0).normal(size=(2, 3, 5, 4)).astype(np.float32)
    value = ort.OrtValue.ortvalue_from_numpy(data)
    for axis, index in ((2, [4, 0, 2]), (0, [1, 1]), (3, [3])):
        out = graph_take(Device(), value, np.array(index), axis).numpy()
        np.testing.assert_array_equal(out, np.take(data, index, axis=axis))


def test_share_buffer_compaction_on_a_device_moves_the_kept_rows() -> None:
    layout = KVLayout("separate", (("k", "v"),), (("pk", "pv"),), np.dtype(np.float32), 2, 4,
                      "k", "model.onnx")  # fmt: skip
    cache = ShareBufferCache(layout, 1, 8, device=Device(copies_inputs=True))
    cache.reserve(8)
    data = np.arange(2 * 8 * 4, dtype=np.float32).reshape(1, 2, 8, 4)
    for value in cache._values:
        value.numpy()[...] = data  # a copy-on-bind CPU device: ORT memory the test can fill
    cache.length = 6
    cache.compact(2, np.array([4, 5]))
    assert cache.length == 4 and cache.capacity == 8
    kept = cache._values[0].numpy()[:, :, :4]
    np.testing.assert_array_equal(kept, data[:, :, [0, 1, 4, 5]])


def test_the_reference_static_scatter_decoder_on_a_device_gives_the_host_tokens(
    fixtures_dir: Path,
) -> None:
    """onnxruntime-genai's own static-scatter test model: its buffers live on the device and
    its tokens are the host's (the kinds refused there: tests/kv/test_device_layouts.py)."""
    folder = fixtures_dir / "static-scatter-bias-decoder"
    rows = []
    for model in (_model(folder), _model(folder, COPY)):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=16, batch_size=2)
        generator = og.Generator(model, params)
        assert generator.kv_cache.kind == "static-scatter"
        generator.append_tokens(np.array([[1, 5, 9, 3, 7], [1, 4, 8, 0, 0]]))
        while not generator.is_done():
            generator.generate_next_token()
        rows.append([generator.get_sequence(i).tolist() for i in range(2)])
    assert rows[1] == rows[0]


def test_a_provider_this_onnxruntime_lacks_names_the_package(smollm2_2layers_dir, capsys) -> None:
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    rc = main(["run", str(smollm2_2layers_dir), "-p", "hi", "--device", "cuda"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "CUDAExecutionProvider" in err and "onnxruntime-gpu" in err
    config = og.Config(smollm2_2layers_dir)
    config.clear_providers()
    config.append_provider("cuda")
    with pytest.raises(og.UnsupportedError, match="onnxruntime-gpu"):
        og.Model(config)


def test_device_names_parse() -> None:
    assert parse_device("cuda:1") == ("cuda", {"device_id": "1"})
    assert parse_device("CPU") == ("cpu", {})
    with pytest.raises(og.UnsupportedError, match="NAME:INDEX"):
        parse_device("cuda:one")


def _slot_tokens(model: og.Model, which: list[int], steps: int, measured: int = 0):
    """Greedy tokens of batched slots ``which`` (each prompt in its own row, decoded together);
    the census of the last ``measured`` decode calls."""
    from genai_runtime.batching.slots import BatchedSlots

    prompts = [STORY, COLOURS, CODE, PROMPT]
    slots = BatchedSlots(model, 4, 64)
    out = {i: [int(np.argmax(slots.prefill(i, np.array(prompts[i]), 0)))] for i in which}
    for _ in range(steps):
        with measure() as m:
            logits = slots.decode(which, np.array([out[i][-1] for i in which]))
        for j, i in enumerate(which):
            out[i].append(int(np.argmax(logits[j])))
    return slots, out, m


def test_batched_server_rows_on_a_device_run_in_one_pass_and_equal_the_host_rows(smollm2_dir):
    """The server's batched backend on a (copy-on-bind) device: the rows' caches are device
    tensors bound by address, 4 rows take one model run per step, nothing is allocated on a
    step, and every row's tokens are the host backend's, together and alone."""
    device, host = _model(smollm2_dir, COPY), _model(smollm2_dir)
    slots, together, m = _slot_tokens(device, [0, 1, 2, 3], 10)
    assert slots.kind == "batched" and not slots._device.host
    assert m.census.session_runs == 1 and m.census.device_allocations == 0
    assert together == _slot_tokens(host, [0, 1, 2, 3], 10)[1]
    for i in range(4):
        assert _slot_tokens(device, [i], 10)[1][i] == together[i]


def test_batched_rows_on_a_device_keep_their_cache_when_it_grows(smollm2_2layers_dir):
    """Past 256 tokens the rows' buffers grow (gathered on the device): tokens stay the host's."""
    from genai_runtime.batching.slots import BatchedSlots

    def run(model: og.Model) -> list[int]:
        slots = BatchedSlots(model, 2, 300)
        prompt = np.array((STORY * 26)[:250])
        token = [int(np.argmax(slots.prefill(1, prompt, 0)))]
        for _ in range(12):  # 250 + 12 > 256: the buffers grow to 300 on the way
            token.append(int(np.argmax(slots.decode([1], np.array(token[-1:]))[0])))
        assert slots._capacity == 300
        return token

    assert run(_model(smollm2_2layers_dir, COPY)) == run(_model(smollm2_2layers_dir))


def _engine_texts(model: og.Model, prompts: list[list[int]], tokens: int):
    """Greedy replies of the server's engine to ``prompts``, submitted together, and the
    census of serving them (the engine's start left out)."""
    import asyncio

    from genai_runtime.batching.settings import RequestSettings
    from genai_runtime.server import engine_over
    from genai_runtime.server.engine import Job

    engine = engine_over(model, max_active=4, max_queued=8, max_context=128)

    async def collect(job: Job) -> str:
        parts = []
        while (event := await job.events.get())[0] == "delta":
            parts.append(event[1])
        assert event[0] == "done", event
        return "".join(parts)

    async def run() -> list[str]:
        loop, jobs = asyncio.get_running_loop(), []
        for ids in prompts:
            s = RequestSettings(max_tokens=tokens, temperature=0.0)
            job = Job(prompt=np.array(ids, np.int64), sampling=s, max_tokens=tokens,
                      deadline=loop.time() + 300, loop=loop, events=asyncio.Queue(),
                      picker=engine.picker(s))  # fmt: skip
            jobs.append(job)
            engine.submit(job)
        return await asyncio.gather(*(collect(j) for j in jobs))

    try:
        assert engine.slots.kind == "batched"
        with measure() as m:
            texts = asyncio.run(run())
        return texts, m.census
    finally:
        engine.stop()


def test_the_server_engine_decodes_4_device_streams_together_each_as_alone(smollm2_dir):
    model = _model(smollm2_dir, COPY)
    prompts = [STORY, COLOURS, CODE, STORY[:4]]
    together, census = _engine_texts(model, prompts, 12)
    # 4 prefills, then one pass per step for all 4 streams (alone they would take 4 x 11).
    assert census.session_runs == 4 + 11
    for prompt, text in zip(prompts, together):
        assert text and _engine_texts(model, [prompt], 12)[0] == [text]
