"""SmolLM2 exported by onnxruntime-genai's builder under each builder option (issue 6.4), run
side by side with the reference: every variant loads, and each that produces logits generates
the reference's tokens (prefill logits within 1e-3).

The folders come from ``benchmarks/build_builder_variants.sh`` into
``$GENAI_RUNTIME_MODELS/issue6`` (default ``~/genai-models/onnx/issue6``); a missing one skips.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

import genai_runtime
from genai_runtime.errors import GenaiRuntimeError, ModelError

MODELS = Path(os.environ.get("GENAI_RUNTIME_MODELS", "~/genai-models/onnx")).expanduser()
PREFIX = "smollm2-135m-instruct-"
WITH_LOGITS = [
    "int4-prune-lm-head",
    "int4-hidden-states",
    "int4-shared-embeddings",
    "int4-accuracy-level-4",
    "int4-kquant",
    "int4-4layers",
    "int8",
    "fp32-prune-lm-head",
]
QUESTION = "What is the capital of France?"


def _reference():
    if os.environ.get("CI", "").lower() == "true":
        return importlib.import_module("onnxruntime_genai")
    return pytest.importorskip("onnxruntime_genai")


def _variant(name: str) -> str:
    path = MODELS / "issue6" / (PREFIX + name)
    if not (path / "genai_config.json").is_file():
        pytest.skip(f"builder variant not built: {path} (benchmarks/build_builder_variants.sh)")
    return str(path)


def _run(og, path: str, new_tokens: int = 24):
    model = og.Model(path)
    tokenizer = og.Tokenizer(model)
    messages = json.dumps([{"role": "user", "content": QUESTION}])
    ids = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + new_tokens)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    logits = np.array(generator.get_logits())[:, -1, :]
    outputs = {}
    for name in ("logits", "hidden_states"):
        try:
            outputs[name] = np.array(generator.get_output(name))
        except Exception:  # the graph lacks it (either side)
            outputs[name] = None
    while not generator.is_done():
        generator.generate_next_token()
    return generator.get_sequence(0).tolist(), logits, outputs


@pytest.mark.parametrize("name", WITH_LOGITS)
def test_variant_matches_the_reference_token_for_token(name: str) -> None:
    path = _variant(name)
    ref = _reference()
    ours_seq, ours_logits, ours_out = _run(genai_runtime, path)
    ref_seq, ref_logits, ref_out = _run(ref, path)
    assert ours_seq == ref_seq
    np.testing.assert_allclose(ours_logits, ref_logits, atol=1e-3, rtol=0)
    for tensor in ("logits", "hidden_states"):
        if ref_out[tensor] is not None:
            assert ours_out[tensor].shape == ref_out[tensor].shape, tensor
            np.testing.assert_allclose(ours_out[tensor], ref_out[tensor], atol=1e-3, rtol=0)
    if "prune" in name:  # the prompt pass returns the last position only
        assert ours_out["logits"].shape[1] == 1


def test_exclude_lm_head_loads_and_a_generator_names_the_missing_logits() -> None:
    path = _variant("int4-exclude-lm-head")
    model = genai_runtime.Model(path)
    assert "hidden_states" in model.ios[next(iter(model.ios))].outputs
    with pytest.raises(ModelError, match="logits"):
        genai_runtime.Generator(model, genai_runtime.GeneratorParams(model))


def test_exclude_embeds_loads_and_generation_names_the_embeddings_input() -> None:
    path = _variant("int4-exclude-embeds")
    model = genai_runtime.Model(path)
    params = genai_runtime.GeneratorParams(model)
    params.set_search_options(max_length=16)
    generator = genai_runtime.Generator(model, params)
    with pytest.raises(GenaiRuntimeError, match="inputs_embeds"):
        generator.append_tokens(np.array([1, 9690, 198], dtype=np.int32))


def test_pruned_lm_head_tiny_graph_matches_numpy(tmp_path: Path) -> None:
    """Logits declared [B, 1, V] are bound as such on a multi-token prompt pass too (the
    failure was "invalid dimensions for output: logits ... Got: 5 Expected: 1")."""
    import tiny_models

    rng = np.random.default_rng(6)
    vocab = tiny_models.VOCAB
    table = rng.standard_normal((vocab, vocab)).astype(np.float32)
    prompt = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    # NumPy reference: each next token is the argmax of the table row of the last one.
    expected = prompt.tolist()
    for row in expected:
        while len(row) < 12:
            row.append(int(np.argmax(table[row[-1]])))
    eos = min(set(range(1, vocab)) - {t for row in expected for t in row})  # never generated
    folder = tmp_path / "pruned"
    tiny_models.pruned_decoder(folder / "model.onnx", table)
    decoder = {"filename": "model.onnx"}
    config = {"type": "x", "context_length": 32, "eos_token_id": eos, "pad_token_id": 0}
    tiny_models.write_config(folder, {"model": {**config, "decoder": decoder}})
    model = genai_runtime.Model(folder)
    params = genai_runtime.GeneratorParams(model)
    params.set_search_options(max_length=12, batch_size=2)
    generator = genai_runtime.Generator(model, params)
    generator.append_tokens(prompt)
    np.testing.assert_allclose(generator.get_logits()[:, 0, :], table[prompt[:, -1]])
    assert generator.get_output("logits").shape == (2, 1, vocab)
    while not generator.is_done():
        generator.generate_next_token()
    assert [generator.get_sequence(i).tolist() for i in range(2)] == expected
