"""Decode speed with and without a JSON-schema constraint, same model, prompt and token count.

Each round runs the constrained generation (a JSON array of four ``{name, age}`` objects, so the
answer is ~80 tokens long), then an unconstrained one of exactly as many new tokens, alternating
which goes first. Decode tok/s counts the steps after the prompt pass; grammar compilation
(done when the Generator is built) is reported apart. Prints per-round ratios
constrained/unconstrained of decode tok/s and their median.

    python benchmarks/constrained_decode.py [MODEL_DIR] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import genai_runtime as og
from genai_runtime.tokenizer import Tokenizer

HERE = Path(__file__).resolve().parent
DEFAULT_MODEL = HERE.parents[1] / "shared" / "models" / "smollm2-135m-instruct-int4"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
SCHEMA = {"type": "array", "items": PERSON, "minItems": 4, "maxItems": 4}
QUESTION = "List four famous scientists with their age at death, as JSON."


def _run(model, prompt, *, guided: bool, new_tokens: int) -> dict:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + new_tokens)
    if guided:
        params.set_guidance("json_schema", json.dumps(SCHEMA))
    t0 = time.perf_counter()
    generator = og.Generator(model, params)
    t1 = time.perf_counter()
    generator.append_tokens(prompt)
    generator.generate_next_token()  # the first token closes the prompt pass
    t2 = time.perf_counter()
    steps = 0
    while not generator.is_done():
        generator.generate_next_token()
        steps += 1
    t3 = time.perf_counter()
    return {
        "build_s": t1 - t0,
        "prefill_s": t2 - t1,
        "decode_tok_s": steps / (t3 - t2) if steps else float("nan"),
        "new_tokens": steps + 1,
        "ids": generator.get_sequence(0)[len(prompt) :].tolist(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    model = og.Model(str(args.model))
    tokenizer = Tokenizer(model)
    prompt = tokenizer.encode(
        tokenizer.apply_chat_template(
            json.dumps([{"role": "user", "content": QUESTION}]), add_generation_prompt=True
        )
    )
    first = _run(model, prompt, guided=True, new_tokens=160)  # warm-up; fixes the length
    n = first["new_tokens"]
    json.loads(tokenizer.decode(first["ids"]))  # the constrained answer is JSON
    print(f"constrained answer ({n} tokens): {tokenizer.decode(first['ids'])}")
    print(f"grammar + tokenizer setup on first use: {first['build_s'] * 1e3:.0f} ms")
    _run(model, prompt, guided=False, new_tokens=n)
    ratios, guided_rates, free_rates, builds = [], [], [], []
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        result = {g: _run(model, prompt, guided=g, new_tokens=n) for g in order}
        guided_rates.append(result[True]["decode_tok_s"])
        free_rates.append(result[False]["decode_tok_s"])
        builds.append(result[True]["build_s"])
        ratios.append(guided_rates[-1] / free_rates[-1])
        print(
            f"round {r}: constrained {guided_rates[-1]:6.1f} tok/s, "
            f"unconstrained {free_rates[-1]:6.1f} tok/s, ratio {ratios[-1]:.3f}"
        )
    print(
        f"median decode tok/s: constrained {statistics.median(guided_rates):.1f}, "
        f"unconstrained {statistics.median(free_rates):.1f}; ratio constrained/unconstrained "
        f"median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}); "
        "Generator build with a grammar (tokenizer cached) "
        f"{statistics.median(builds) * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
