"""Real-time factor of Whisper transcription: genai_runtime against onnxruntime-genai.

Both sides transcribe the same clip from the file (decode, resample, log-mel, encoder, greedy
decoder) through the reference's API (processor -> set_inputs -> generate). Rounds alternate
which side goes first; each side is loaded once and warmed up. RTF = audio seconds / wall
seconds (higher is faster). ``--threads N`` overlays the same intra-op thread count on both the
encoder and the decoder of both sides.

    python benchmarks/whisper_rtf.py [MODEL_DIR] [AUDIO] [--rounds 5] [--threads N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import soundfile

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT.parent / "shared" / "models" / "whisper-tiny.en-int4"
DEFAULT_AUDIO = ROOT.parent / "shared" / "fixtures" / "audio" / "jfk.flac"
PROMPT = "<|startoftranscript|><|notimestamps|>"


def _runner(og: Any, model_dir: str, audio: str, threads: int | None):
    config = og.Config(model_dir)
    if threads is not None:
        options = {"session_options": {"intra_op_num_threads": threads}}
        config.overlay(json.dumps({"model": {"encoder": options, "decoder": options}}))
    model = og.Model(config)
    processor = model.create_multimodal_processor()

    def run() -> list[int]:
        inputs = processor(PROMPT, audios=og.Audios.open(audio))
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=448)
        generator = og.Generator(model, params)
        generator.set_inputs(inputs)
        while not generator.is_done():
            generator.generate_next_token()
        return list(map(int, generator.get_sequence(0)))

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", nargs="?", default=str(DEFAULT_MODEL))
    parser.add_argument("audio", nargs="?", default=str(DEFAULT_AUDIO))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args()

    import onnxruntime_genai as ref_og

    import genai_runtime as our_og

    seconds = soundfile.info(args.audio).duration
    sides = {
        "ours": _runner(our_og, args.model_dir, args.audio, args.threads),
        "reference": _runner(ref_og, args.model_dir, args.audio, args.threads),
    }
    ids = {name: run() for name, run in sides.items()}  # warm-up, and the outputs to compare
    walls: dict[str, list[float]] = {name: [] for name in sides}
    ratios = []
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            start = time.perf_counter()
            sides[name]()
            walls[name].append(time.perf_counter() - start)
        ratios.append(walls["reference"][-1] / walls["ours"][-1])
    result = {
        "audio_seconds": round(seconds, 3),
        "threads": args.threads,
        "rounds": args.rounds,
        "same_ids": ids["ours"][: len(ids["reference"])] == ids["reference"],
        "rtf": {n: round(seconds / statistics.median(w), 2) for n, w in walls.items()},
        "median_wall_s": {n: round(statistics.median(w), 3) for n, w in walls.items()},
        "speed_ratio_ours_over_reference": {
            "median": round(statistics.median(ratios), 3),
            "min": round(min(ratios), 3),
            "max": round(max(ratios), 3),
        },
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
