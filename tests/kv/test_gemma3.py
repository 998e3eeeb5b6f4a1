"""Gemma 3 270M exported by the reference's builder (fp32 and int4): share-buffer caches whose
local layers use GroupQueryAttention's 512-token window. Side by side with onnxruntime-genai,
greedy tokens must be identical, on a prompt longer than the window too.

The models are built from the registry's GGUF wheels (../shared/recipes/); the tests skip when
they are absent (``GENAI_RUNTIME_MODELS``, default ``~/genai-models/onnx``).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import pytest

import genai_runtime as og

pytestmark = pytest.mark.slow

NEW_TOKENS = 10
LONG = (
    "The history of the city begins with a small settlement on the river, where traders met "
    "to exchange salt, grain and cloth. Over the centuries the market grew into a town, the "
    "town into a city, and the city into the capital of a wide region. "
)
PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    LONG * 14 + "In one sentence, the city's story is",  # > 512 tokens: past the local window
]


def _model_dir(name: str) -> Path:
    root = Path(os.environ.get("GENAI_RUNTIME_MODELS", Path.home() / "genai-models" / "onnx"))
    path = root / name
    if not (path / "genai_config.json").is_file():
        pytest.skip(f"built model not present: {path}")
    return path


@functools.cache
def _pair(name: str):
    import onnxruntime_genai as reference

    path = str(_model_dir(name))
    ours, theirs = og.Model(path), reference.Model(path)
    return (og, ours, og.Tokenizer(ours)), (reference, theirs, reference.Tokenizer(theirs))


def _greedy(api, model, ids: np.ndarray, steps: int) -> tuple[list[int], np.ndarray]:
    params = api.GeneratorParams(model)
    # The reference sizes its share buffer to max_length, which GQA wants >= the 512 window.
    params.set_search_options(max_length=max(512, len(ids) + steps))
    generator = api.Generator(model, params)
    generator.append_tokens(ids)
    first = np.asarray(generator.get_logits()).reshape(-1)
    out = []
    for _ in range(steps):
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out, first


@pytest.mark.parametrize("name", ["gemma-3-270m-fp32", "gemma-3-270m-int4"])
def test_gemma3_generates_the_reference_tokens(name) -> None:
    (api, model, tokenizer), (ref_api, ref_model, ref_tokenizer) = _pair(name)
    layout = model.plan.layout
    assert layout.window == 512 and 0 in layout.window_layers and 5 not in layout.window_layers
    for prompt in PROMPTS:
        ids = np.asarray(tokenizer.encode(prompt), np.int32)
        assert ids.tolist() == list(ref_tokenizer.encode(prompt))
        for tokens in (ids, np.concatenate([[2], ids]).astype(np.int32)):  # raw, and with BOS
            ours, our_logits = _greedy(api, model, tokens, NEW_TOKENS)
            theirs, their_logits = _greedy(ref_api, ref_model, tokens, NEW_TOKENS)
            assert ours == theirs, (prompt[:40], len(tokens))
            np.testing.assert_allclose(our_logits, their_logits, atol=1e-3, rtol=0)
    assert len(tokenizer.encode(PROMPTS[-1])) > 512


def test_gemma3_small_max_length_still_gets_a_window_sized_buffer() -> None:
    """max_length below the window: the reference's GroupQueryAttention refuses its buffer
    ("KV cache capacity (13) must be at least local_window_size (512)"); ours holds the window."""
    (api, model, tokenizer), (ref_api, ref_model, _) = _pair("gemma-3-270m-fp32")
    ids = tokenizer.encode("The capital of France is")
    params = api.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 4)
    generator = api.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    assert generator.kv_cache.capacity == 512
    theirs, _ = _greedy(ref_api, ref_model, np.asarray(ids, np.int32), 4)
    assert generator.get_sequence(0).tolist()[len(ids) :] == theirs
