"""Benchmark genai_runtime against onnxruntime-genai on the same model, prompt and token counts.

Driver (default): tokenizes the prompt once with the reference tokenizer, then for each round
runs every side in its own fresh subprocess (alternating the order each round), and prints per
figure the median of each side and the median/min/max of the per-round ratios ours/reference.

Worker (``--worker ours|reference|bare``): loads the model, warms up, times K generations and
prints one JSON line. Both runtimes use their default session options unless ``--threads N``
sets the same intra-op thread count on every side.

    python benchmarks/vs_onnxruntime_genai.py [MODEL_DIR] [--rounds 7] [--new-tokens 64]
        [--prompt TEXT] [--chat] [--json OUT] [--include-bare]

See benchmarks/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# The shared material sits beside the checkout: <repo>/../shared.
DEFAULT_MODEL = HERE.parents[1] / "shared" / "models" / "smollm2-135m-instruct-int4"
DEFAULT_QUESTION = "What is the capital of France?"
SIDES = ("ours", "reference", "bare")
TOKENIZE = "tokenize"  # a worker that only tokenizes, so the driver never loads a model


# -- worker -------------------------------------------------------------------------------


@dataclass
class Timing:
    """One timed generation: seconds for prefill, each decode call, and the tokens produced."""

    prefill_s: float
    step_s: list[float]
    tokens: list[int]
    setup_s: float


def _time_generation(
    make: Callable[[], Any],
    append: Callable[[Any], None],
    step: Callable[[Any], None],
    done: Callable[[Any], bool],
    tokens: Callable[[Any], list[int]],
    new_tokens: int,
) -> Timing:
    """Time one generation with the same protocol for every side.

    ``append`` is the prefill (the prompt's forward pass, which yields the first token's logits);
    each ``step`` runs the pending token (from the second call on) and chooses the next one.
    """
    clock = time.perf_counter
    t0 = clock()
    gen = make()
    t1 = clock()
    append(gen)
    t2 = clock()
    steps = []
    for _ in range(new_tokens):
        a = clock()
        step(gen)
        steps.append(clock() - a)
    if not done(gen):
        raise RuntimeError("generator not done after exactly N tokens (max_length mismatch?)")
    out = tokens(gen)
    if len(out) != new_tokens:
        raise RuntimeError(f"expected {new_tokens} new tokens, got {len(out)}")
    return Timing(prefill_s=t2 - t1, step_s=steps, tokens=out, setup_s=t1 - t0)


def _genai_callables(
    og: Any,
    model_dir: str,
    prompt_ids: list[int],
    threads: int | None = None,
    overlay: str | None = None,
    device: str | None = None,
    batch: int = 1,
) -> tuple[Any, Callable]:
    """Load an onnxruntime-genai-compatible module's model; return it and a runner factory.

    ``device`` (``cuda``, ``cuda:1``, ...) selects the execution provider on both sides through
    the API they share; ``batch`` decodes that many copies of the prompt together."""
    import numpy as np

    config = og.Config(model_dir)
    if threads is not None:  # the same genai_config overlay on both sides
        options = {"session_options": {"intra_op_num_threads": threads}}
        config.overlay(json.dumps({"model": {"decoder": options}}))
    if device:
        name, _, index = device.partition(":")
        config.clear_providers()
        config.append_provider(name)
        if index:
            config.set_provider_option(name, "device_id", index)
    if overlay:  # a candidate setting, measured alone (one side only)
        config.overlay(overlay)
    model = og.Model(config)
    prompt = np.repeat(np.asarray(prompt_ids, dtype=np.int32)[None, :], batch, axis=0)

    def runner(new_tokens: int) -> Timing:
        length = len(prompt_ids) + new_tokens

        def make() -> Any:
            params = og.GeneratorParams(model)
            # min_length == max_length masks EOS until the end: exactly N tokens, both sides.
            params.set_search_options(
                do_sample=False, max_length=length, min_length=length, batch_size=batch
            )
            return og.Generator(model, params)

        return _time_generation(
            make,
            lambda g: g.append_tokens(prompt),
            lambda g: g.generate_next_token(),
            lambda g: g.is_done(),
            lambda g: [int(t) for t in g.get_sequence(0)[len(prompt_ids) :]],
            new_tokens,
        )

    return model, runner


def _bare_callables(
    model_dir: str, prompt_ids: list[int], threads: int | None = None
) -> tuple[Any, Callable]:
    sys.path.insert(0, str(HERE))
    from bare_onnxruntime import BareDecoder

    decoder = BareDecoder(model_dir, threads=threads)

    def runner(new_tokens: int) -> Timing:
        return _time_generation(
            lambda: decoder.start(prompt_ids, len(prompt_ids) + new_tokens),
            lambda g: g.prefill(),
            lambda g: g.next_token(),
            lambda g: g.is_done(),
            lambda g: g.sequence[len(prompt_ids) :],
            new_tokens,
        )

    return decoder, runner


def _onnxruntime_library() -> str | None:
    """The onnxruntime binary this process mapped, to show which build each side really ran."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                name = Path(path).name
                if name.startswith(("libonnxruntime.so", "onnxruntime_pybind11_state")):
                    return path
    except OSError:
        pass
    return None


def _vm_hwm_mib() -> float | None:
    """This process's own RSS high-water mark (reset by exec, unlike ru_maxrss)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def run_worker(
    side: str,
    model_dir: str,
    prompt_ids: list[int],
    new_tokens: int,
    timed: int,
    warmup: int,
    threads: int | None = None,
    overlay: str | None = None,
    device: str | None = None,
    batch: int = 1,
    reference_overlay: str | None = None,
) -> dict[str, Any]:
    """Load, warm up, time ``timed`` generations; return medians and peak RSS."""
    t0 = time.perf_counter()
    # Import inside the timed load: each side pays for its own import, nothing else is loaded.
    if side == "ours":
        import genai_runtime as og

        _, runner = _genai_callables(og, model_dir, prompt_ids, threads, overlay, device, batch)
    elif side == "reference":
        import onnxruntime_genai as og

        _, runner = _genai_callables(
            og, model_dir, prompt_ids, threads, reference_overlay, device, batch
        )
    elif side == "bare":
        _, runner = _bare_callables(model_dir, prompt_ids, threads)
    else:
        raise ValueError(f"unknown side {side!r}")
    load_s = time.perf_counter() - t0

    runner(warmup)  # one-off first-run costs (allocator growth, kernel caches) stay out
    runs = [runner(new_tokens) for _ in range(timed)]

    n_prompt = len(prompt_ids)
    prefill = [r.prefill_s for r in runs]
    decode = [sum(r.step_s) for r in runs]
    ttft = [r.prefill_s + r.step_s[0] for r in runs]
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {
        "side": side,
        "prompt_tokens": n_prompt,
        "new_tokens": new_tokens,
        "timed_generations": timed,
        "load_s": load_s,
        "setup_ms": 1e3 * statistics.median(r.setup_s for r in runs),
        "prefill_tok_s": statistics.median(n_prompt / s for s in prefill),
        "decode_tok_s": statistics.median(new_tokens / s for s in decode),
        "ttft_ms": 1e3 * statistics.median(ttft),
        "peak_rss_mib": rss_kib / 1024,
        "vm_hwm_mib": _vm_hwm_mib(),
        "os_threads": len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self") else None,
        "tokens": runs[0].tokens,
        "tokens_stable": all(r.tokens == runs[0].tokens for r in runs),
        "onnxruntime_library": _onnxruntime_library(),
    }


# -- driver -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    higher_is_better: bool
    fmt: str


FIGURES = (
    Figure("prefill_tok_s", "prefill tok/s", True, "{:.1f}"),
    Figure("decode_tok_s", "decode tok/s", True, "{:.1f}"),
    Figure("ttft_ms", "time to first token ms", False, "{:.2f}"),
    Figure("peak_rss_mib", "peak RSS MiB", False, "{:.1f}"),
    Figure("load_s", "load s", False, "{:.3f}"),
    Figure("setup_ms", "generator setup ms", False, "{:.3f}"),
)


def tokenize(model_dir: str, text: str, chat: bool) -> list[int]:
    """Token ids from the reference tokenizer, so every side processes identical ids.

    Runs in the ``tokenize`` worker: on Linux a child inherits its parent's RSS into
    ``ru_maxrss`` across fork/exec, so the driver itself must never load a model.
    """
    import onnxruntime_genai as og

    tokenizer = og.Tokenizer(og.Model(model_dir))
    if chat:
        messages = json.dumps([{"role": "user", "content": text}])
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return [int(t) for t in tokenizer.encode(text)]


def spawn(side: str, args: argparse.Namespace, ids_json: str) -> dict[str, Any]:
    """Run one worker in a fresh interpreter and parse its JSON line."""
    cmd = [
        sys.executable, str(Path(__file__).resolve()), args.model_dir, "--worker", side,
        "--prompt-ids", ids_json, "--new-tokens", str(args.new_tokens),
        "--timed", str(args.timed), "--warmup-tokens", str(args.warmup_tokens),
    ]  # fmt: skip
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    if args.ours_overlay and side == "ours":
        cmd += ["--ours-overlay", args.ours_overlay]
    if args.reference_overlay and side == "reference":
        cmd += ["--reference-overlay", args.reference_overlay]
    if args.device:
        cmd += ["--device", args.device]
    if args.batch != 1:
        cmd += ["--batch", str(args.batch)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"worker {side!r} failed with exit code {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(rounds: list[dict[str, dict[str, Any]]], sides: list[str]) -> dict[str, Any]:
    """Per figure: each side's median, and the median/min/max of per-round ratios."""
    summary: dict[str, Any] = {}
    for fig in FIGURES:
        entry: dict[str, Any] = {"higher_is_better": fig.higher_is_better}
        for side in sides:
            entry[side] = _median([r[side][fig.key] for r in rounds])
        for num in ("ours", "bare"):
            if num not in sides:
                continue
            ratios = [r[num][fig.key] / r["reference"][fig.key] for r in rounds]
            entry[f"{num}/reference"] = {
                "median": _median(ratios), "min": min(ratios), "max": max(ratios),
                "per_round": ratios,
            }  # fmt: skip
        summary[fig.key] = entry
    return summary


def parity(rounds: list[dict[str, dict[str, Any]]], sides: list[str]) -> dict[str, bool]:
    """Whether each side's first timed generation matched the reference's, in every round."""
    out = {}
    for side in sides:
        if side == "reference":
            continue
        out[side] = all(
            r[side]["tokens"] == r["reference"]["tokens"]
            and r[side]["tokens_stable"]
            and r["reference"]["tokens_stable"]
            for r in rounds
        )
    return out


def print_table(summary: dict[str, Any], sides: list[str], meta: dict[str, Any]) -> None:
    bare = "bare" in sides
    head = ["figure", "better", "ours", "reference", "ours/ref median", "ratio min..max"]
    if bare:
        head += ["bare (floor)", "bare/ref median"]
    rows = [head]
    for fig in FIGURES:
        e = summary[fig.key]
        r = e["ours/reference"]
        row = [
            fig.label,
            "higher" if fig.higher_is_better else "lower",
            fig.fmt.format(e["ours"]),
            fig.fmt.format(e["reference"]),
            f"{r['median']:.3f}",
            f"{r['min']:.3f}..{r['max']:.3f}",
        ]
        if bare:
            row += [fig.fmt.format(e["bare"]), f"{e['bare/reference']['median']:.3f}"]
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    print(
        f"\nmodel {meta['model_dir']} | prompt {meta['prompt_tokens']} tokens | "
        f"{meta['new_tokens']} new tokens | {meta['rounds']} rounds x {meta['timed']} timed "
        f"generations | greedy | "
        + (
            f"intra_op_num_threads={meta['threads']}"
            if meta["threads"]
            else "default session options"
        )
    )
    for i, row in enumerate(rows):
        cells = [c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))]
        print("  ".join(cells))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for side, same in meta["parity"].items():
        print(f"parity: {side} tokens == reference tokens: {'yes' if same else 'NO'}")
    threads = ", ".join(f"{s} {n}" for s, n in meta["os_threads"].items())
    print(f"OS threads per worker after the run: {threads}")
    if meta["threads"] is not None:
        print(f"intra-op threads: {meta['threads']} on every side (--threads)")
    else:
        print(
            f"default intra-op threads: reference max(1, min(16, cpus // 2)) = "
            f"{meta['reference_default_intra_op_threads']}; onnxruntime's own default "
            f"(0 = physical cores) otherwise"
        )
    for side, (maxrss, hwm) in meta["rss_check"].items():
        if hwm is not None and abs(maxrss - hwm) > 0.02 * hwm:
            print(f"warning: {side} ru_maxrss {maxrss:.1f} MiB != VmHWM {hwm:.1f} MiB")


def run_driver(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    chat = args.chat or args.prompt is None
    text = DEFAULT_QUESTION if args.prompt is None else args.prompt
    cmd = [sys.executable, str(Path(__file__).resolve()), args.model_dir, "--worker", TOKENIZE]
    cmd += ["--prompt", text] + (["--chat"] if chat else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"tokenizing failed with exit code {proc.returncode}")
    prompt_ids: list[int] = json.loads(proc.stdout.strip().splitlines()[-1])
    ids_json = json.dumps(prompt_ids)
    sides = ["ours", "reference"] + (["bare"] if args.include_bare else [])
    print(
        f"{len(prompt_ids)} prompt tokens, {args.new_tokens} new tokens, {args.rounds} rounds; "
        f"sides: {', '.join(sides)}",
        flush=True,
    )
    rounds: list[dict[str, dict[str, Any]]] = []
    for i in range(args.rounds):
        # Rotate the order so neither side always runs first (cache/thermal/neighbour effects).
        order = sides[i % len(sides) :] + sides[: i % len(sides)]
        result = {side: spawn(side, args, ids_json) for side in order}
        rounds.append(result)
        o, ref = result["ours"], result["reference"]
        print(
            f"round {i + 1}/{args.rounds} ({' -> '.join(order)}): "
            f"decode {o['decode_tok_s']:.1f} vs {ref['decode_tok_s']:.1f} tok/s "
            f"({o['decode_tok_s'] / ref['decode_tok_s']:.3f}), "
            f"prefill {o['prefill_tok_s']:.1f} vs {ref['prefill_tok_s']:.1f} tok/s "
            f"({o['prefill_tok_s'] / ref['prefill_tok_s']:.3f}), "
            f"TTFT {o['ttft_ms']:.2f} vs {ref['ttft_ms']:.2f} ms",
            flush=True,
        )
    summary = summarize(rounds, sides)
    meta = {
        "model_dir": args.model_dir,
        "prompt_text": text,
        "chat_template": chat,
        "prompt_tokens": len(prompt_ids),
        "prompt_ids": prompt_ids,
        "new_tokens": args.new_tokens,
        "rounds": args.rounds,
        "timed": args.timed,
        "warmup_tokens": args.warmup_tokens,
        "threads": args.threads,
        "parity": parity(rounds, sides),
        "python": sys.version.split()[0],
        "machine": platform.platform(),
        "cpu_count": os.cpu_count(),
        "onnxruntime_library": {s: rounds[0][s]["onnxruntime_library"] for s in sides},
        "generated_tokens": {s: rounds[0][s]["tokens"] for s in sides},
        "os_threads": {s: rounds[0][s]["os_threads"] for s in sides},
        # onnxruntime-genai's own default (Model::CreateSessionOptionsFromConfig).
        "reference_default_intra_op_threads": max(1, min(16, (os.cpu_count() or 1) // 2)),
        "rss_check": {
            s: (
                _median([r[s]["peak_rss_mib"] for r in rounds]),
                None
                if rounds[0][s]["vm_hwm_mib"] is None
                else _median([r[s]["vm_hwm_mib"] for r in rounds]),
            )
            for s in sides
        },
    }
    print_table(summary, sides, meta)
    meta["ours_overlay"] = args.ours_overlay
    if args.json:
        Path(args.json).write_text(
            json.dumps({"meta": meta, "summary": summary, "rounds": rounds}, indent=2) + "\n"
        )
        print(f"wrote {args.json}")
    return summary, meta


# The equal-thread table (benchmarks/results/*-equal-threads.md): (label, model folder); extra
# models live under $GENAI_RUNTIME_MODELS (default ~/genai-models/onnx), as the tests find them.
_MODELS_ROOT = Path(os.environ.get("GENAI_RUNTIME_MODELS", "~/genai-models/onnx")).expanduser()
TABLE_MODELS = (
    ("int4", DEFAULT_MODEL),
    ("fp32", _MODELS_ROOT / "smollm2-135m-instruct-fp32"),
)


def run_table(args: argparse.Namespace) -> None:
    """Run the driver for 1 and 2 threads on the int4 and fp32 SmolLM2 (each present folder)
    and print the equal-thread table rows: ours/reference medians with the per-round range."""
    rows = []
    for label, folder in TABLE_MODELS:
        if not (Path(folder) / "genai_config.json").is_file():
            print(f"skipping {label}: no model at {folder}")
            continue
        for threads in (1, 2, None):  # None: each side's default settings
            run = argparse.Namespace(**{**vars(args), "model_dir": str(folder), "threads": threads,
                                        "json": None})  # fmt: skip
            summary, meta = run_driver(run)
            cells = []
            for key in ("prefill_tok_s", "decode_tok_s", "load_s"):
                r = summary[key]["ours/reference"]
                cells.append(f"{r['median']:.3f} ({r['min']:.3f}..{r['max']:.3f})")
            same = "yes" if meta["parity"]["ours"] else "NO"
            rows.append(
                f"| SmolLM2-135M {label} | {threads or 'default'} | "
                + " | ".join(cells)
                + f" | {same} |"
            )
    print(
        "\n| model | threads | prefill ours/ref | decode ours/ref | load ours/ref | same tokens |"
    )
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(row)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", nargs="?", default=str(DEFAULT_MODEL))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt", help=f"prompt text (default: chat({DEFAULT_QUESTION!r}))")
    parser.add_argument("--chat", action="store_true", help="apply the chat template to --prompt")
    parser.add_argument("--json", help="write every round's raw figures and the summary here")
    parser.add_argument("--include-bare", action="store_true", help="also run the bare floor")
    parser.add_argument(
        "--threads",
        type=int,
        help="intra-op threads for every side (default: each side's own default)",
    )
    parser.add_argument(
        "--ours-overlay",
        help="genai_config JSON overlaid on ours only: measure one candidate setting alone",
    )
    parser.add_argument(
        "--reference-overlay",
        help="genai_config JSON overlaid on the reference only (e.g. its CUDA graph setting)",
    )
    parser.add_argument(
        "--device",
        help="execution provider for both sides: cuda, cuda:N, ... (default: the folder's)",
    )
    parser.add_argument(
        "--batch", type=int, default=1, help="copies of the prompt decoded together"
    )
    parser.add_argument(
        "--table",
        action="store_true",
        help="equal-thread table: 1 and 2 threads on the int4 and fp32 SmolLM2 (ratios only)",
    )
    # Worker-side options (the driver passes them through).
    parser.add_argument("--worker", choices=(*SIDES, TOKENIZE), help=argparse.SUPPRESS)
    parser.add_argument("--prompt-ids", help=argparse.SUPPRESS)
    parser.add_argument("--timed", type=int, default=3, help="timed generations per worker")
    parser.add_argument("--warmup-tokens", type=int, default=4, help="tokens in the warm-up run")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.new_tokens < 1 or args.timed < 1 or args.warmup_tokens < 1:
        parser.error("--rounds, --new-tokens, --timed and --warmup-tokens must be >= 1")
    if args.worker == TOKENIZE:
        print(json.dumps(tokenize(args.model_dir, args.prompt or DEFAULT_QUESTION, args.chat)))
    elif args.worker:
        if not args.prompt_ids:
            parser.error("--worker needs --prompt-ids")
        result = run_worker(
            args.worker, args.model_dir, json.loads(args.prompt_ids), args.new_tokens,
            args.timed, args.warmup_tokens, args.threads, args.ours_overlay, args.device,
            args.batch, args.reference_overlay,
        )  # fmt: skip
        print(json.dumps(result))
    elif args.table:
        run_table(args)
    else:
        run_driver(args)


if __name__ == "__main__":
    main()
