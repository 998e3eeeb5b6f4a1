"""Beam search beside onnxruntime-genai 0.18.0, in one process: same tokens, and the time ratio.

For each case (SmolLM2 int4 on a chat prompt, Whisper tiny.en int4 on the reference's jfk.flac
features) and each ``num_beams``, both runtimes generate to the end, alternating which goes
first over ``--rounds`` rounds. Printed per case: the steps taken, whether every step's next
tokens and every returned sequence equal the reference's, and the median wall time of the
generation (prompt included) for each side with the ratio ours / reference.

    python benchmarks/beam_search.py [--shared ../shared] [--rounds 3] [--beams 2 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime_genai as ref

import genai_runtime as ours

QUESTION = '[{"role": "user", "content": "What is the capital of France? Answer in one word."}]'


def _generate(api: Any, model: Any, options: dict, inputs: dict) -> tuple[float, Any]:
    start = time.perf_counter()
    params = api.GeneratorParams(model)
    params.set_search_options(**options)
    generator = api.Generator(model, params)
    if "audio_features" in inputs:
        named = api.NamedTensors()
        named["audio_features"] = api.Tensor(inputs["audio_features"])
        named["input_ids"] = inputs["input_ids"]
        generator.set_inputs(named)
    else:
        generator.append_tokens(inputs["input_ids"])
    steps = []
    while not generator.is_done():
        generator.generate_next_token()
        steps.append(generator.get_next_tokens().tolist())
    returned = options["num_return_sequences"]
    sequences = [generator.get_sequence(i).tolist() for i in range(returned)]
    return time.perf_counter() - start, (steps, sequences)


def _case(name: str, folder: Path, inputs: dict, beams: int, max_length: int, rounds: int):
    models = {"reference": ref.Model(str(folder)), "ours": ours.Model(str(folder))}
    apis = {"reference": ref, "ours": ours}
    options = dict(num_beams=beams, num_return_sequences=beams, max_length=max_length)
    times: dict[str, list[float]] = {"reference": [], "ours": []}
    outputs = {}
    for r in range(rounds):
        order = ["ours", "reference"] if r % 2 else ["reference", "ours"]
        for side in order:
            seconds, outputs[side] = _generate(apis[side], models[side], options, inputs)
            times[side].append(seconds)
    same = outputs["ours"] == outputs["reference"]
    ref_s, our_s = (statistics.median(times[s]) for s in ("reference", "ours"))
    steps = len(outputs["reference"][0])
    print(
        f"{name:8} beams {beams}  steps {steps:3}  tokens equal {same!s:5}  "
        f"reference {ref_s:6.3f} s  ours {our_s:6.3f} s  ratio {our_s / ref_s:5.2f}"
    )
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=Path(__file__).parents[2] / "shared")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--beams", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    smollm2 = args.shared / "models" / "smollm2-135m-instruct-int4"
    tokenizer = ref.Tokenizer(ref.Model(str(smollm2)))
    prompt = tokenizer.encode(tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True))
    with np.load(args.shared / "fixtures" / "audio" / "jfk.features.npz") as z:
        audio = {"audio_features": z["audio_features"], "input_ids": z["input_ids"]}
    whisper = args.shared / "models" / "whisper-tiny.en-int4"
    all_same = True
    for beams in args.beams:
        all_same &= _case(
            "smollm2", smollm2, {"input_ids": prompt}, beams, len(prompt) + 30, args.rounds
        )
        all_same &= _case("whisper", whisper, audio, beams, 40, args.rounds)
    raise SystemExit(0 if all_same else 1)


if __name__ == "__main__":
    main()
