"""Long audio: word error rate of Whisper over clips longer than one 30 s window.

Builds two clips from ``../shared/fixtures/audio/jfk.flac`` and espeak-ng speech of known text
(a 44 s clip and a 2 min one, 22.05 kHz, pauses between passages), transcribes each with
genai_runtime (``Model.transcribe``: window by window with timestamps) and with onnxruntime-genai
0.18 in the same run (one pass: the reference reads the first 30 s; and each part alone, the
model's own error rate on this speech without any window edge), and reports each side's word
error rate against the known text, the words it got, the longest phrase it repeated that the
text does not repeat, and the wall time.

    apt-get install -y espeak-ng
    python benchmarks/long_audio.py [MODEL_DIR] [--keep DIR] [--json OUT]

Words are compared lowercased without punctuation, numbers up to twenty read as words (espeak
says "ten", Whisper writes "10").
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DEFAULT_MODEL = SHARED / "models" / "whisper-tiny.en-int4"
JFK = SHARED / "fixtures" / "audio" / "jfk.flac"
JFK_TEXT = (
    "And so my fellow Americans, ask not what your country can do for you, ask what you can "
    "do for your country."
)
PASSAGES = [
    "The weather station on the hill measures wind, rain and temperature every ten minutes. "
    "When a storm comes in from the west, the readings change quickly, and the volunteers who "
    "look after the station write down what they see.",
    "Our library opens at nine in the morning and closes at six in the evening. Children can "
    "borrow up to five books at a time, and adults may keep a book for three weeks before they "
    "return it.",
    "A good cup of tea needs fresh water, a warm pot and a little patience. Pour the water just "
    "after it boils, wait for four minutes, and then remove the leaves so the tea does not "
    "become bitter.",
    "The train to the coast leaves from platform two. It stops at every small town along the "
    "river, and the journey takes a little under two hours on a quiet day.",
    "Farmers in the valley plant their seeds in early spring. By the end of summer the fields "
    "are full of corn, beans and pumpkins, and the whole village helps to bring in the harvest.",
    "Learning to play the piano takes time. Start with simple scales, practice a little every "
    "day, and do not worry about mistakes, because every musician makes them.",
]
# (name, parts: a passage index or "jfk", seconds of silence after each part)
CLIPS = [
    ("clip-44s", [0, "jfk", 1], 1.5),
    ("clip-2min", [2, "jfk", 3, 4, "jfk", 5, 0, 1], 2.5),
]
RATE = 22050
NUMBERS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]
PROMPT = "<|startoftranscript|><|notimestamps|>"


def words(text: str) -> list[str]:
    out = []
    for word in re.sub(r"[^a-z0-9' ]", " ", text.lower()).split():
        out.append(NUMBERS[int(word)] if word.isdigit() and int(word) <= 20 else word)
    return out


def word_errors(reference: list[str], hypothesis: list[str]) -> int:
    row = list(range(len(hypothesis) + 1))
    for i in range(1, len(reference) + 1):
        prev, row = row, [i] + [0] * len(hypothesis)
        for j in range(1, len(hypothesis) + 1):
            same = reference[i - 1] == hypothesis[j - 1]
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (not same))
    return row[-1]


def longest_new_repeat(reference: list[str], hypothesis: list[str]) -> int:
    """Length of the longest phrase said twice in a row by the hypothesis but never by the
    known text: a window decoded twice shows up here."""
    ref = " ".join(reference)
    best = 0
    for n in range(3, len(hypothesis) // 2 + 1):
        for i in range(len(hypothesis) - 2 * n + 1):
            phrase = hypothesis[i : i + n]
            if phrase == hypothesis[i + n : i + 2 * n] and " ".join(phrase * 2) not in ref:
                best = n
    return best


def speak(text: str, folder: Path) -> np.ndarray:
    out = folder / "speech.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "140", "-w", str(out), text], check=True)
    pcm, rate = soundfile.read(out, dtype="float32")
    if rate != RATE:
        raise SystemExit(f"espeak-ng wrote {rate} Hz; expected {RATE}")
    return pcm


def jfk_at_rate() -> np.ndarray:
    """jfk.flac (44.1 kHz) at 22.05 kHz: a short low-pass, then every second sample."""
    pcm, rate = soundfile.read(JFK, dtype="float32")
    pcm = pcm.mean(axis=1) if pcm.ndim == 2 else pcm
    kernel = np.hanning(31)
    return np.convolve(pcm, kernel / kernel.sum(), mode="same")[:: rate // RATE]


def build(folder: Path) -> list[tuple[str, Path, str, list[Path]]]:
    """(name, clip, known text, each part alone as its own file) per clip."""
    clips = []
    jfk = jfk_at_rate()
    for name, parts, pause in CLIPS:
        audio, text, alone = [], [], []
        for k, part in enumerate(parts):
            pcm = jfk if part == "jfk" else speak(PASSAGES[part], folder)
            audio += [0.8 * pcm, np.zeros(int(RATE * pause), np.float32)]
            text.append(JFK_TEXT if part == "jfk" else PASSAGES[part])
            alone.append(folder / f"{name}-part{k}.wav")
            soundfile.write(alone[-1], 0.8 * pcm, RATE, subtype="PCM_16")
        path = folder / f"{name}.wav"
        soundfile.write(path, np.concatenate(audio), RATE, subtype="PCM_16")
        clips.append((name, path, " ".join(text), alone))
    return clips


def reference_transcript(model, og, path: Path) -> str:
    processor = model.create_multimodal_processor()
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=448)
    generator = og.Generator(model, params)
    generator.set_inputs(processor(PROMPT, audios=og.Audios.open(str(path))))
    while not generator.is_done():
        generator.generate_next_token()
    return processor.decode(generator.get_sequence(0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", nargs="?", default=str(DEFAULT_MODEL))
    parser.add_argument("--keep", metavar="DIR", help="write the clips here and keep them")
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args()
    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng is not installed (apt-get install -y espeak-ng)")

    import onnxruntime_genai as ref_og

    import genai_runtime as og

    folder = Path(args.keep or tempfile.mkdtemp(prefix="long-audio-"))
    folder.mkdir(parents=True, exist_ok=True)
    ours = og.Model(args.model_dir)
    reference = ref_og.Model(args.model_dir)
    results = []
    for name, path, known, alone in build(folder):
        seconds = soundfile.info(str(path)).duration
        row = {"clip": name, "seconds": round(seconds, 2), "known_words": len(words(known))}
        for side, run in (
            ("ours", lambda p=path: ours.transcribe(p)),
            ("reference", lambda p=path: reference_transcript(reference, ref_og, p)),
            # The model's own errors on this speech, no window edge involved: each part (at
            # most 30 s) transcribed alone by the reference.
            ("reference_part_by_part",
             lambda a=alone: " ".join(reference_transcript(reference, ref_og, p) for p in a)),
        ):  # fmt: skip
            start = time.perf_counter()
            text = run()
            wall = time.perf_counter() - start
            got = words(text)
            row[side] = {
                "wer": round(word_errors(words(known), got) / len(words(known)), 3),
                "words": len(got),
                "longest_new_repeat": longest_new_repeat(words(known), got),
                "wall_s": round(wall, 2),
                "text": text,
            }
        results.append(row)
        print(
            f"{name}: {seconds:.1f} s, {row['known_words']} words | ours: WER "
            f"{row['ours']['wer']:.3f}, {row['ours']['words']} words, repeat "
            f"{row['ours']['longest_new_repeat']}, {row['ours']['wall_s']} s | reference: WER "
            f"{row['reference']['wer']:.3f}, {row['reference']['words']} words | reference part "
            f"by part: WER {row['reference_part_by_part']['wer']:.3f}, "
            f"{row['reference_part_by_part']['words']} words"
        )
        print(f"  ours: {row['ours']['text']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
