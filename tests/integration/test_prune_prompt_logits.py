"""The opt-in prompt-logits pruning rewrite gives the unpruned graph's logits and tokens.

``"genai_runtime.prune_prompt_logits": "1"`` edits the decoder so the lm_head runs on each row's
last real position only. These tests run the same model with and without it, side by side:
prompt-pass logits equal (well within 1e-3) and greedy tokens identical, for one prompt, a
right-padded batch of unequal prompts, and a second append on a running generator.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import genai_runtime as og
from genai_runtime.errors import ModelError
from genai_runtime.runtime.prune import SETTING

MODELS = Path(os.environ.get("GENAI_RUNTIME_MODELS", "~/genai-models/onnx")).expanduser()


def _model(folder: Path, prune: str | None) -> og.Model:
    config = og.Config(str(folder))
    options: dict = {"intra_op_num_threads": 1}
    if prune is not None:
        options[SETTING] = prune
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    return og.Model(config)


def _logits_dims(model: og.Model) -> list:
    (session,) = model.sessions.values()
    return next(o.shape for o in session.get_outputs() if o.name == "logits")


def _run(model: og.Model, rows: list[list[int]], new: int, more: list[int] | None = None):
    params = og.GeneratorParams(model)
    longest = max(len(r) for r in rows)
    length = longest + new + len(more or [])
    params.set_search_options(do_sample=False, max_length=length, batch_size=len(rows))
    gen = og.Generator(model, params)
    if len(rows) == 1:
        gen.append_tokens(np.asarray(rows, dtype=np.int32))
    else:
        pad = model.spec.tokens.pad or 0
        batch = np.full((len(rows), longest), pad, np.int32)  # right-padded, as encode_batch
        for i, r in enumerate(rows):
            batch[i, : len(r)] = r
        gen.append_tokens(batch)
    first = gen.get_logits().copy()
    for _ in range(new // 2):
        gen.generate_next_token()
    later = None
    if more:
        gen.append_tokens(np.asarray([more], dtype=np.int32))
        later = gen.get_logits().copy()
    while not gen.is_done():
        gen.generate_next_token()
    return first, later, [list(gen.get_sequence(i)) for i in range(len(rows))]


def _same(folder: Path, rows: list[list[int]], new: int, more: list[int] | None = None) -> None:
    full = _model(folder, None)
    pruned = _model(folder, "1")
    assert _logits_dims(full)[1] != 1
    assert _logits_dims(pruned)[1] == 1  # the rewrite really happened
    a, b = _run(full, rows, new, more), _run(pruned, rows, new, more)
    assert np.abs(a[0] - b[0]).max() < 1e-4
    if more:
        assert np.abs(a[1] - b[1]).max() < 1e-4
    assert a[2] == b[2]


def test_tiny_gpt2_single_batch_and_second_append(gpt2_dir: Path) -> None:
    _same(gpt2_dir, [[5, 17, 80, 3, 99, 41]], 12, more=[7, 8, 9])
    _same(gpt2_dir, [[5, 17, 80, 3, 99, 41], [11, 12], [600, 2, 3, 4]], 10)


def test_smollm2_int4_share_buffer_cache(smollm2_dir: Path) -> None:
    tokenizer = og.Tokenizer(_model(smollm2_dir, None))
    prompts = ["The capital of France is", "Explain photosynthesis in one sentence for a child."]
    rows = [list(tokenizer.encode(p)) for p in prompts]
    _same(smollm2_dir, rows[1:], 16, more=list(tokenizer.encode(" And then?")))
    _same(smollm2_dir, rows, 12)


def test_smollm2_fp32() -> None:
    folder = MODELS / "smollm2-135m-instruct-fp32"
    if not (folder / "genai_config.json").is_file():
        pytest.skip(f"{folder} not built")
    tokenizer = og.Tokenizer(_model(folder, None))
    rows = [list(tokenizer.encode(p)) for p in ("Hello there", "List three colours of the sky.")]
    _same(folder, rows, 12)


def test_setting_must_be_0_or_1(gpt2_dir: Path) -> None:
    with pytest.raises(ModelError, match=SETTING):
        _model(gpt2_dir, "yes")
    assert _logits_dims(_model(gpt2_dir, "0"))[1] != 1
