"""The canonical onnxruntime-genai loop as one whole process, for either runtime.

    python benchmarks/canonical_loop.py genai_runtime MODEL_DIR
    python benchmarks/canonical_loop.py onnxruntime_genai MODEL_DIR

Imports, model and tokenizer loading, the chat template, a 64-token greedy answer streamed to
stdout: what a user's script pays end to end. Time it from outside, e.g. ``/usr/bin/time -v``.
"""

from __future__ import annotations

import importlib
import sys


def main(module: str, model_dir: str, new_tokens: int = 64) -> None:
    og = importlib.import_module(module)
    model = og.Model(og.Config(model_dir))
    tokenizer = og.Tokenizer(model)
    stream = tokenizer.create_stream()
    messages = '[{"role": "user", "content": "What is the capital of France?"}]'
    prompt = tokenizer.apply_chat_template(messages=messages, add_generation_prompt=True)
    tokens = tokenizer.encode(prompt)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(tokens) + new_tokens, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(tokens)
    while not generator.is_done():
        generator.generate_next_token()
        sys.stdout.write(stream.decode(generator.get_next_tokens()[0]))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
