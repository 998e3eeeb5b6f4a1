"""onnxruntime-genai's canonical Python loop runs unchanged with ``import genai_runtime as og``
and prints exactly what the reference prints."""

from __future__ import annotations

import importlib
import io
import os

import pytest
from conftest import require_shared

import genai_runtime


def _reference():
    if os.environ.get("CI", "").lower() == "true":
        return importlib.import_module("onnxruntime_genai")  # CI installs it: fail if missing
    return pytest.importorskip("onnxruntime_genai")


def canonical_loop(og, model_path: str, question: str, out: io.StringIO) -> None:
    """The loop from onnxruntime-genai's examples (model-qa.py), verbatim but for print()."""
    config = og.Config(model_path)
    config.clear_providers()
    model = og.Model(config)
    tokenizer = og.Tokenizer(model)
    tokenizer_stream = tokenizer.create_stream()
    search_options = {"max_length": 128, "do_sample": False}
    messages = f'[{{"role": "user", "content": "{question}"}}]'
    prompt = tokenizer.apply_chat_template(messages=messages, add_generation_prompt=True)
    input_tokens = tokenizer.encode(prompt)
    params = og.GeneratorParams(model)
    params.set_search_options(**search_options)
    generator = og.Generator(model, params)
    generator.append_tokens(input_tokens)
    while not generator.is_done():
        generator.generate_next_token()
        new_token = generator.get_next_tokens()[0]
        out.write(tokenizer_stream.decode(new_token))
    del generator


@pytest.mark.parametrize(
    "question", ["What is the capital of France?", "Write a haiku about the sea."]
)
def test_canonical_loop_prints_what_the_reference_prints(question: str) -> None:
    path = str(require_shared("models", "smollm2-135m-instruct-int4"))
    ours, theirs = io.StringIO(), io.StringIO()
    canonical_loop(genai_runtime, path, question, ours)
    canonical_loop(_reference(), path, question, theirs)
    assert ours.getvalue() == theirs.getvalue()
    if "France" in question:
        assert ours.getvalue().startswith("The capital of France is Paris")


def test_model_generate_streams_text() -> None:
    model = genai_runtime.Model(require_shared("models", "smollm2-135m-instruct-int4"))
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chunks = list(model.generate(messages, max_length=50))
    assert "".join(chunks).startswith("The capital of France is Paris")
    assert model.type == "llama" and model.device_type == "CPU"
