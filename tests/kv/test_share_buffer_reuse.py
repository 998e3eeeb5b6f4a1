"""A released share-buffer cache's mapped buffers serve the next generation of the same shape:
same tokens as fresh buffers (stale contents are never read), and big caches are not kept."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np

import genai_runtime as og
from genai_runtime.kv import share_buffer


def _generate(model: og.Model, prompt: list[int], max_length: int) -> tuple[list[int], int]:
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=max_length)
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray([prompt], np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    cache = gen._exec.cache
    address = cache._arrays[0].__array_interface__["data"][0]
    return list(gen.get_sequence(0)), address


def test_next_generation_reuses_the_mapping_and_gives_the_same_tokens(
    smollm2_2layers_dir: Path,
) -> None:
    model = og.Model(str(smollm2_2layers_dir))
    long_prompt = list(range(300, 340))
    first, address = _generate(model, long_prompt, 60)
    gc.collect()
    # A shorter, different generation (same max_length) on the recycled, dirty buffers...
    short, reused = _generate(model, [5, 6, 7], 60)
    assert reused == address
    gc.collect()
    share_buffer._spare = None  # ...equals the same generation on fresh zeroed buffers.
    fresh_short, _ = _generate(model, [5, 6, 7], 60)
    assert short == fresh_short
    gc.collect()
    again, _ = _generate(model, long_prompt, 60)
    assert again == first


def test_caches_beyond_the_limit_are_not_kept(smollm2_2layers_dir: Path, monkeypatch) -> None:
    monkeypatch.setattr(share_buffer, "REUSE_LIMIT", 0)
    share_buffer._spare = None
    model = og.Model(str(smollm2_2layers_dir))
    _generate(model, [5, 6, 7], 12)
    gc.collect()
    assert share_buffer._spare is None
