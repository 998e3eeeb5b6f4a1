"""The Windows ML composite designs' own graphs, exported from random-weight transformers
checkpoints by ``benchmarks/winml_export.py``, run through the runtime against PyTorch's own
``generate``: T5 encoder + decoder with the static cache (index_copy at ``cache_position``, new
K/V out, cross-attention K/V from the encoder at a fixed source length), and a Qwen3 decoder split
into prefill (chunks of 8) and decode graphs with the sliding-window cache (FIFO) and with the
static cache. Greedy tokens equal, every step's logits within 1e-3.

The exports need torch and transformers (test-only, never package dependencies): without them
these tests skip with the reason. The cache rules they rely on are also checked without torch.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import genai_runtime as og
from genai_runtime.cli import main as cli_main
from genai_runtime.errors import GenerationError
from genai_runtime.kv.base import KVLayout
from genai_runtime.kv.fixed_shape import ChunkShape, StaticFifoCache, StaticIndexCopyCache
from genai_runtime.session.census import measure
from genai_runtime.session.device import COPY_ON_BIND
from genai_runtime.session.positions import PositionState

REPO = Path(__file__).resolve().parents[2]
ATOL = 1e-3
T5_PROMPTS = [[5, 9, 22], [7, 3, 40, 41, 12, 9, 88], [60, 2, 2, 14, 5]]
QWEN_SHORT = [5, 17, 33]  # under one prefill chunk (8)
QWEN_LONG = [5, 17, 33, 8, 60, 11, 42, 9, 70, 3, 21]  # a chunk and a padded one


def _export_module():
    spec = importlib.util.spec_from_file_location(
        "winml_export", REPO / "benchmarks/winml_export.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("torch", reason="the exports need torch (a test-only dependency)")
    pytest.importorskip("transformers", reason="the exports need transformers (test-only)")
    return _export_module().tiny_exports(tmp_path_factory.mktemp("winml"))


def _generate(folder: Path, prompts: list[list[int]], steps: int, max_length: int):
    """Greedy tokens per row (prompt padding dropped) and each step's logits [B, V]."""
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, do_sample=False, batch_size=len(prompts))
    generator = og.Generator(model, params)
    width = max(map(len, prompts))
    generator.append_tokens(np.array([p + [0] * (width - len(p)) for p in prompts], np.int64))
    logits = []
    for _ in range(steps):
        logits.append(generator.get_logits()[:, 0].copy())
        generator.generate_next_token()
        if generator.is_done():
            break
    tokens = [generator.get_sequence(b)[width:].tolist() for b in range(len(prompts))]
    return tokens, logits, generator


def _check_logits(ours: list[np.ndarray], theirs) -> None:
    assert len(ours) == len(theirs)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(a, b.numpy(), atol=ATOL, rtol=0, err_msg=f"step {step}")


# -- T5 with the static cache --------------------------------------------------------------------


@pytest.mark.parametrize("rows", [[0], [1], [2], [0, 1], [1, 2]])
def test_t5_static_cache_equals_generate(exports, rows) -> None:
    import torch
    from transformers import T5ForConditionalGeneration

    prompts = [T5_PROMPTS[r] for r in rows]
    folder = exports["t5-static" if len(rows) == 1 else "t5-static-batch2"]
    steps = 14
    tokens, logits, generator = _generate(folder, prompts, steps, max_length=40)
    assert generator.kv_plan.kind == "static-index-copy"
    ref_model = T5ForConditionalGeneration.from_pretrained(exports["checkpoint-t5"]).eval()
    width = max(map(len, prompts)) + 1  # EOS appended, as the runtime does for the encoder
    source = [p + [1] + [0] * (width - len(p) - 1) for p in prompts]
    mask = [[1] * (len(p) + 1) + [0] * (width - len(p) - 1) for p in prompts]
    with torch.no_grad():
        ref = ref_model.generate(
            torch.tensor(source), attention_mask=torch.tensor(mask), max_new_tokens=steps,
            do_sample=False, output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
    assert tokens == [row[1:] for row in ref.sequences.tolist()]  # theirs starts with the start
    _check_logits(logits, ref.logits)


# -- Qwen3: prefill + decode, sliding-window and static caches -----------------------------------


@pytest.mark.parametrize("prompt", [QWEN_SHORT, QWEN_LONG], ids=["short", "long"])
@pytest.mark.parametrize("cache", ["sliding", "static"])
def test_qwen3_prefill_decode_equals_generate(exports, cache, prompt) -> None:
    import torch
    from transformers import Qwen3ForCausalLM

    window = 24  # the checkpoint's sliding window and both exports' fixed context
    total = 40 if cache == "sliding" else window  # the FIFO runs past its window
    steps = total - len(prompt)
    tokens, logits, generator = _generate(
        exports[f"qwen3-{cache}"], [prompt], steps, max_length=total
    )
    kind = "static-fifo" if cache == "sliding" else "static-index-copy"
    assert generator.kv_plan.kind == kind
    ref_model = Qwen3ForCausalLM.from_pretrained(
        exports["checkpoint-qwen3"], attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        ref = ref_model.generate(
            torch.tensor([prompt]), max_new_tokens=steps, do_sample=False,
            output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
    assert tokens[0] == ref.sequences[0, len(prompt) :].tolist()
    _check_logits(logits, ref.logits)
    if cache == "sliding":
        assert len(prompt) + len(tokens[0]) > window and generator.kv_cache.evicted


def test_static_export_past_its_context_is_a_clear_error(exports) -> None:
    model = og.Model(str(exports["qwen3-static"]))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=48, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(QWEN_LONG)
    for _ in range(24 - len(QWEN_LONG)):
        generator.generate_next_token()
    with pytest.raises(GenerationError, match="fixed context of 24"):
        generator.generate_next_token()
        generator.get_logits()


@pytest.mark.parametrize(
    "name, route, kind, why",
    [
        ("t5-static", "encoder-decoder", "static-index-copy", "'cache_position' input"),
        ("qwen3-static", "prefill-decode", "static-index-copy", "'cache_position' input"),
        ("qwen3-sliding", "prefill-decode", "static-fifo", "no cache_position input"),
    ],
)
def test_validate_and_explain_name_the_route_and_the_cache(exports, capsys, name, route, kind,
                                                           why) -> None:  # fmt: skip
    folder = str(exports[name])
    assert cli_main(["validate", folder]) == 0
    out = capsys.readouterr().out
    assert f"route {route})" in out
    assert f"kv cache: {kind} (" in out and why in out
    assert cli_main(["explain", folder]) == 0
    out = capsys.readouterr().out
    assert f"route: {route}" in out and f"kind:      {kind} (" in out and why in out


# -- on a device (copy-on-bind emulation) --------------------------------------------------------


def _device_run(folder: Path, prompts: list[list[int]], steps: int, max_length: int, device: bool):
    """Greedy rows, and the census of each ``generate_next_token`` (every session copies its
    bound inputs, as a GPU's provider does, with ``device``)."""
    config = og.Config(str(folder))
    if device:
        config.set_session_config_entry(COPY_ON_BIND, "1")
    model = og.Model(config)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, batch_size=len(prompts))
    generator = og.Generator(model, params)
    width = max(map(len, prompts))
    generator.append_tokens(np.array([p + [0] * (width - len(p)) for p in prompts], np.int64))
    steps_seen = []
    while len(steps_seen) < steps and not generator.is_done():
        with measure() as m:
            generator.generate_next_token()
        steps_seen.append(m.census)
    rows = [generator.get_sequence(b).tolist() for b in range(len(prompts))]
    return rows, steps_seen, generator


@pytest.mark.parametrize(
    "name, prompts, steps, max_length",
    [
        ("qwen3-static", [QWEN_LONG], 13, 24),
        ("qwen3-sliding", [QWEN_LONG], 29, 40),  # past its window of 24: the FIFO slides
        ("t5-static-batch2", T5_PROMPTS[1:], 14, 40),
    ],
)
def test_the_exports_on_a_device_give_the_host_tokens(exports, name, prompts, steps, max_length):
    """Prefill (chunks of 8) and decode (one token) graphs with ``[B, ctx]`` masks sharing one
    device cache, and T5's encoder filling the cross cache: the host's tokens; once the decode
    graph has run, a step makes nothing on the device and brings back only the chosen ids."""
    ours, census, generator = _device_run(exports[name], prompts, steps, max_length, True)
    assert not generator.kv_cache._device.host
    assert ours == _device_run(exports[name], prompts, steps, max_length, False)[0]
    assert len(census) == steps
    for step in census[2:]:  # the first picks the prompt's token; the second first decodes
        assert step.device_allocations == 0
        assert (step.device_to_host, step.device_to_host_bytes) == (1, 8 * len(prompts))


# -- the cache rules the exports rely on (no torch) ----------------------------------------------


def _cache(cls, ctx: int, chunk: int, batch: int = 1):
    layout = KVLayout(
        format="separate", past=(("pk", "pv"),), present=(("nk", "nv"),),
        dtype=np.dtype(np.float32), num_kv_heads=1, head_size=2, pattern="pk", file="g.onnx",
        static_capacity=ctx, new_rows=chunk,
    )  # fmt: skip
    return cls(layout, batch, 64, PositionState(batch, 64, 0))


def test_in_graph_masks_cover_the_graphs_own_buffer() -> None:
    """A ``[B, ctx]`` mask: index-copy marks slots < valid + k; the FIFO marks the held rows
    shifted left by the whole chunk (the graph drops the oldest C) and the chunk's real rows."""
    ctx, c = 10, 4
    cache = _cache(StaticIndexCopyCache, ctx, 1)
    cache.valid[:] = 3
    cache.fill([np.array([7, 8])], ChunkShape(c, in_graph=True))
    assert cache.mask[0].tolist() == [1] * 5 + [0] * 5
    assert cache.cache_position[0].tolist() == [3, 4, 5, 6]
    assert cache.position_ids[0].tolist() == [3, 4, 0, 0]
    fifo = _cache(StaticFifoCache, ctx, 1)
    fifo.valid[:] = 8  # only ctx - C = 6 of them are in the graph's view this pass
    fifo.fill([np.array([7, 8])], ChunkShape(c, in_graph=True))
    assert fifo.mask[0].tolist() == [1] * 6 + [0, 0, 1, 1]
    assert fifo.position_ids[0].tolist() == [0, 0, 8, 9]
    fifo.fill([np.array([7])], ChunkShape(1, in_graph=True))
    assert fifo.mask[0].tolist() == [0, 1, 1, 1, 1, 1, 1, 1, 1, 1]


def test_in_graph_index_copy_refuses_a_padded_chunk_past_the_context() -> None:
    cache = _cache(StaticIndexCopyCache, 20, 1)
    cache.check_room(np.array([16]), ChunkShape(8, in_graph=True))  # chunks end at slot 16
    with pytest.raises(GenerationError, match="whole chunks of 8 slots"):
        cache.check_room(np.array([17]), ChunkShape(8, in_graph=True))  # third ends at 24
    cache.check_room(np.array([17]), ChunkShape(8))  # past + chunk graphs: pads are not written


def test_provider_folders_put_each_stage_on_its_provider(exports) -> None:
    """``t5-static-openvino`` (encoder on OpenVINO) and ``t5-static-openvino-decoder`` (both):
    the same graphs, each session's ``provider_options`` set; where onnxruntime lacks OpenVINO,
    loading one is the error naming the package (tests/kv/test_stage_providers.py runs them)."""
    import json

    import onnxruntime as ort

    module = _export_module()
    for name, providers in module.STAGE_FOLDERS.items():
        doc = json.loads((exports[name] / "genai_config.json").read_text(encoding="utf-8"))
        for session, provider in zip(("encoder", "decoder"), providers):
            entry = doc["pipeline"]["sessions"][session]
            options = entry.get("session_options", {}).get("provider_options")
            assert options == (None if provider == "cpu" else [{provider: {"device_type": "CPU"}}])
    if "OpenVINOExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(og.UnsupportedError, match="install onnxruntime-openvino"):
            og.Model(str(exports["t5-static-openvino"]))
