"""Gemma 3 270M exported by the reference's builder (fp32 and int4): share-buffer caches whose
local layers use GroupQueryAttention's 512-token window. Side by side with onnxruntime-genai,
greedy tokens must be identical, on a prompt longer than the window too.

The models are built from the registry's GGUF wheels (../shared/recipes/); the tests skip when
they are absent (``GENAI_RUNTIME_MODELS``, default ``~/genai-models/onnx``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import genai_runtime as og
from genai_runtime.errors import GenaiRuntimeError

pytestmark = pytest.mark.slow

NEW_TOKENS = 8
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
    LONG * 11
    + "In one sentence, the city's story is",  # > 512 tokens: past the 512 window + 16 slack
]


def _model_dir(name: str) -> Path:
    root = Path(os.environ.get("GENAI_RUNTIME_MODELS", Path.home() / "genai-models" / "onnx"))
    path = root / name
    if not (path / "genai_config.json").is_file():
        pytest.skip(f"built model not present: {path}")
    return path


def _generator(api, model, ids, max_length: int):
    params = api.GeneratorParams(model)
    params.set_search_options(max_length=max_length)
    generator = api.Generator(model, params)
    generator.append_tokens(ids)
    return generator


def _greedy(api, model, ids: np.ndarray, steps: int, max_length: int = 0):
    # The reference sizes its buffers from max_length; GQA wants them >= the 512 window.
    generator = _generator(api, model, ids, max_length or max(512, len(ids) + steps))
    first = np.asarray(generator.get_logits()).reshape(-1)
    out = []
    for _ in range(steps):
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out, first, generator


@pytest.mark.parametrize("name", ["gemma-3-270m-fp32", "gemma-3-270m-int4"])
def test_gemma3_generates_the_reference_tokens(name) -> None:
    import onnxruntime_genai as reference

    path = str(_model_dir(name))
    model, ref_model = og.Model(path), reference.Model(path)
    tokenizer, ref_tokenizer = og.Tokenizer(model), reference.Tokenizer(ref_model)
    layout = model.plan.layout
    assert layout.window == 512 and 0 in layout.window_layers and 5 not in layout.window_layers
    for k, prompt in enumerate(PROMPTS):
        ids = np.asarray(tokenizer.encode(prompt), np.int32)
        assert ids.tolist() == list(ref_tokenizer.encode(prompt))
        variants = [ids, np.concatenate([[2], ids]).astype(np.int32)] if k == 0 else [ids]
        for tokens in variants:  # the first prompt raw and with BOS 2 prepended
            ours, our_logits, generator = _greedy(og, model, tokens, NEW_TOKENS)
            theirs, their_logits, _ = _greedy(reference, ref_model, tokens, NEW_TOKENS)
            assert ours == theirs, (prompt[:40], len(tokens))
            np.testing.assert_allclose(our_logits, their_logits, atol=1e-3, rtol=0)
    # The long prompt went past window + slack: the windowed layers evicted, rewinding is refused.
    assert len(ids) > 528 and generator.kv_plan.kind == "sliding-window"
    assert generator.kv_cache.evicted and generator.kv_cache.window_capacity == 528
    with pytest.raises(GenaiRuntimeError, match="evicted"):
        generator.rewind_to(len(ids))
    if name.endswith("fp32"):
        _small_max_length(model, tokenizer, ref_model)


def _small_max_length(model, tokenizer, ref_model) -> None:
    """max_length below the window: the reference's GroupQueryAttention refuses its buffer
    ("KV cache capacity (13) must be at least local_window_size (512)"); ours holds the window."""
    import onnxruntime_genai as reference

    ids = np.asarray(tokenizer.encode(PROMPTS[0]), np.int32)
    ours, _, generator = _greedy(og, model, ids, 4, max_length=len(ids) + 4)
    assert generator.is_done() and generator.kv_cache.window_capacity == 512
    with pytest.raises(Exception, match="local_window_size"):
        _greedy(reference, ref_model, ids, 4, max_length=len(ids) + 4)
    theirs, _, _ = _greedy(reference, ref_model, ids, 4)
    assert ours == theirs
