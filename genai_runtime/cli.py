"""``genai-runtime``: validate, explain and migrate configs; run, chat with and benchmark models.

Every error raised on purpose (a ``GenaiRuntimeError``) is printed as ``error: <message>`` on
stderr with exit status 1; usage errors exit 2, as argparse does.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .config import load, to_v2
from .config.loader import find_config_file, load_document, validate_document
from .config.spec import PipelineSpec
from .errors import ConfigError, GenaiRuntimeError, GenerationError
from .kv import plan_cache
from .multimodal.processor import TRANSCRIBE_PROMPT
from .routing import classify
from .runtime.confirm import config_problems, probe_problems
from .runtime.plan import Plan, build_plan, graph_problems
from .runtime.sessions import load_sessions

V2_SCHEMA_NAME = "genai_config.v2.schema.json"
_FILLER = "The quick brown fox jumps over the lazy dog. "

# CLI flag -> onnxruntime-genai search option, for run / chat.
_SEARCH_FLAGS = {
    "do_sample": "do_sample",
    "top_k": "top_k",
    "top_p": "top_p",
    "temperature": "temperature",
    "repetition_penalty": "repetition_penalty",
    "seed": "random_seed",
    "min_length": "min_length",
    "no_repeat_ngram_size": "no_repeat_ngram_size",
}


# ---------------------------------------------------------------------------------------------
# Entry point


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 error, 2 usage)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "run" and args.prompt is None and args.audio is None:
            parser.error("run: give a prompt (-p TEXT) or an audio file (--audio FILE)")
    except SystemExit as exc:  # usage errors and --help: keep argparse's status
        return int(exc.code or 0)
    try:
        return args.func(args)
    except GenaiRuntimeError as exc:
        _print_error(exc)
        return 1
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            # The reader went away (e.g. `| head`): silence the final flush and stop.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


def _print_error(exc: GenaiRuntimeError) -> None:
    if isinstance(exc, ConfigError) and len(exc.problems) > 1:
        head = f"invalid config {exc.source}" if exc.source else "invalid config"
        print(f"error: {head} ({len(exc.problems)} problems):", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
    else:
        print(f"error: {exc}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="genai-runtime",
        description="Config-driven ONNX generative-model runtime (onnxruntime-genai compatible).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check a config (and its ONNX graphs) for every problem")
    _add_config_args(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("explain", help="show the route, flow, stages and KV cache of a config")
    _add_config_args(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("migrate", help="write the v2 form of a config (v1 or v2)")
    p.add_argument("path", metavar="PATH", help="model folder or config file")
    p.add_argument("-o", "--output", metavar="OUT", help="output file (default: stdout)")
    p.add_argument("--force", action="store_true", help="allow -o to overwrite an existing file")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("run", help="generate text for one prompt, streamed")
    p.add_argument("model_dir", metavar="MODEL_DIR")
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow code the config asks for (pipeline.controller, custom ops libraries)",
    )
    p.add_argument("-p", "--prompt", help="prompt text (required unless --audio)")
    p.add_argument(
        "--audio",
        metavar="FILE",
        help="audio file for a speech model (wav/flac/ogg/mp3; needs the 'audio' extra); the "
        "prompt defaults to Whisper's transcription prompt",
    )
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("--system", metavar="TEXT", help="system message (implies --chat)")
    lengths = p.add_mutually_exclusive_group()
    lengths.add_argument(
        "--max-length", type=_positive_int, metavar="N", help="total length, prompt included"
    )
    lengths.add_argument(
        "--max-new-tokens", type=_positive_int, metavar="N", help="max_length = prompt length + N"
    )
    _add_search_args(p)
    guide = p.add_mutually_exclusive_group()
    guide.add_argument(
        "--json-schema", metavar="FILE", help="constrain the output to a JSON schema"
    )
    guide.add_argument("--regex", metavar="PATTERN", help="constrain the output to a regex")
    guide.add_argument("--lark", metavar="FILE", help="constrain the output to a Lark grammar")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("chat", help="interactive multi-turn chat over stdin")
    p.add_argument("model_dir", metavar="MODEL_DIR")
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow code the config asks for (pipeline.controller, custom ops libraries)",
    )
    p.add_argument("--system", metavar="TEXT", help="system message")
    p.add_argument(
        "--max-length",
        type=_positive_int,
        metavar="N",
        help="bound on the whole conversation, in tokens",
    )
    p.add_argument(
        "--max-new-tokens", type=_positive_int, metavar="N", help="cap on each reply, in tokens"
    )
    _add_search_args(p)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("bench", help="measure prefill / decode speed and memory")
    p.add_argument("model_dir", metavar="MODEL_DIR")
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow code the config asks for (pipeline.controller, custom ops libraries)",
    )
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", metavar="TEXT", help="prompt text")
    prompt.add_argument(
        "--prompt-tokens",
        type=_positive_int,
        metavar="N",
        default=None,
        help="a synthetic prompt of exactly N tokens (default 32)",
    )
    p.add_argument(
        "--new-tokens",
        type=_at_least(2),
        default=32,
        metavar="N",
        help="tokens generated per run, exactly (default 32)",
    )
    p.add_argument(
        "--runs", type=_positive_int, default=3, metavar="N", help="timed runs (default 3)"
    )
    p.add_argument(
        "--warmup", type=_at_least(0), default=1, metavar="N", help="untimed runs first (default 1)"
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (needs the server extra)")
    p.add_argument("model_dir", metavar="MODEL_DIR")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=_at_least(0), default=8000, help="0 picks a free port")
    p.add_argument("--api-key", metavar="K", help="require Authorization: Bearer K")
    p.add_argument(
        "--insecure", action="store_true", help="allow a non-loopback host without an API key"
    )
    p.add_argument("--served-name", metavar="NAME", help="model name (default: folder name)")
    p.add_argument("--max-queued", type=_at_least(0), default=16, metavar="N")
    p.add_argument("--max-active", type=_positive_int, default=4, metavar="N",
                   help="requests decoding together (default 4)")  # fmt: skip
    p.add_argument("--max-context", type=_positive_int, metavar="N",
                   help="cap on prompt + max_tokens (default 2048)")  # fmt: skip
    p.add_argument("--timeout", type=float, metavar="S", help="per-request timeout (default 600)")
    p.add_argument("--interleave", action="store_true", help="no batched decode")
    p.add_argument("--ray", action="store_true",
                   help="run as a Ray Serve deployment (needs the ray extra)")  # fmt: skip
    p.add_argument("--replicas", type=_positive_int, metavar="N",
                   help="with --ray: replicas, one model each (default 1)")  # fmt: skip
    p.add_argument("--threads", type=_positive_int, metavar="N",
                   help="with --ray: threads (and CPUs) per replica (default 1)")  # fmt: skip
    p.set_defaults(func=cmd_serve)

    from .importer.commands import add_parsers  # import / pull (GGUF -> model folder)

    add_parsers(sub)
    return parser


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH", help="model folder or config file (JSON/YAML, v1/v2)")
    p.add_argument(
        "--config-only",
        action="store_true",
        help="check the config alone: do not load the ONNX files",
    )
    p.add_argument(
        "--presets",
        action="extend",
        nargs="+",
        default=[],
        metavar="DIR",
        help="extra preset folders, searched before the built-in ones",
    )
    p.add_argument(
        "--root",
        metavar="DIR",
        help="folder config file names may point into (default: the model folder)",
    )


def _add_search_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--do-sample", action="store_true", default=None, help="sample (not greedy)")
    p.add_argument("--top-k", type=int, metavar="K")
    p.add_argument("--top-p", type=float, metavar="P")
    p.add_argument("--temperature", type=float, metavar="T")
    p.add_argument("--repetition-penalty", type=float, metavar="R")
    p.add_argument("--seed", type=int, metavar="S", help="random seed for sampling")
    p.add_argument("--min-length", type=int, metavar="N", help="minimum total length")
    p.add_argument("--no-repeat-ngram-size", type=int, metavar="N")


def _search_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        option: getattr(args, flag)
        for flag, option in _SEARCH_FLAGS.items()
        if getattr(args, flag) is not None
    }


def _at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse


_positive_int = _at_least(1)


# ---------------------------------------------------------------------------------------------
# validate / explain / migrate


@dataclass
class GraphCheck:
    """The outcome of loading every session of a spec and matching the config against it."""

    plan: Plan | None
    errors: list[str]
    warnings: list[str]


def check_graphs(spec: PipelineSpec) -> GraphCheck:
    """Load every session (without running it) and list every config/graph mismatch."""
    sessions, ios, failures = load_sessions(spec, spec.sessions)  # every one: report them all
    errors = [str(exc) for exc in failures]
    warnings: list[str] = []
    errors += graph_problems(spec, ios)
    if errors:
        return GraphCheck(None, errors, warnings)
    try:
        plan = build_plan(spec, ios)
    except GenaiRuntimeError as exc:
        return GraphCheck(None, [str(exc)], warnings)
    if plan.layout is not None:
        try:
            plan_cache(plan.layout, spec.state.kv_cache, spec.generation.past_present_share_buffer)
        except ConfigError as exc:
            errors += [str(p) for p in exc.problems]
        except GenaiRuntimeError as exc:  # the graph is fine; this runtime cannot run it yet
            warnings.append(f"runtime: {exc}")
    errors += [str(p) for p in config_problems(spec, plan)]
    if not errors and spec.plugin is None:
        probe_errors, probe_warnings = probe_problems(spec, plan, sessions)
        errors += probe_errors
        warnings += probe_warnings
    if spec.plugin is not None:
        warnings.append("pipeline.plugin loads code: it runs only with trust_remote_code=True")
    return GraphCheck(plan, errors, warnings)


def tokenizer_problems(spec: PipelineSpec) -> list[str]:
    """Load the folder's tokenizer (if it has one) and compile its chat templates."""
    from .tokenizer import Tokenizer, _compile_template

    folder = spec.model_dir
    if folder is None or not (folder / "tokenizer.json").is_file():
        return []
    try:
        tokenizer = Tokenizer.from_dir(
            folder,
            bos_token_id=spec.tokens.bos,
            eos_token_ids=spec.tokens.eos,
            pad_token_id=spec.tokens.pad,
        )
        for source in tokenizer._templates.values():
            _compile_template(source)
    except GenaiRuntimeError as exc:
        return [str(exc)]
    return []


def cmd_validate(args: argparse.Namespace) -> int:
    spec = load(args.path, preset_dirs=args.presets, root=args.root)
    route = classify(spec)
    if not args.config_only:
        check = check_graphs(spec)
        for warning in check.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        errors = check.errors + tokenizer_problems(spec)
        if errors:
            for error in errors:
                print(f"error: {error}", file=sys.stderr)
            return 1
    print(f"ok: {args.path} (v{spec.source_version}, route {route.kind})")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from .explain import explain_spec, format_report

    spec = load(args.path, preset_dirs=args.presets, root=args.root)
    plan, note = None, "--config-only"
    if not args.config_only:
        check = check_graphs(spec)
        plan = check.plan
        note = "; ".join(check.errors) or None
    report = explain_spec(
        spec,
        plan=plan,
        source=str(find_config_file(args.path)),
        version=spec.source_version,
        graph_note=note,
    )
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        sys.stdout.write(format_report(report))
    return 0


def migrate_document(path: str | os.PathLike) -> dict[str, Any]:
    """The v2 form of a config (presets not resolved), ``$schema`` first; checked against v2."""
    loaded = load_document(path)
    doc = to_v2(loaded.doc, loaded.version)
    out = {"$schema": V2_SCHEMA_NAME, **{k: v for k, v in doc.items() if k != "$schema"}}
    # A translation that the v2 schema rejects is our bug; say so rather than write it.
    validate_document(out, 2, source=f"{loaded.path} (migrated to v2)")
    return out


def cmd_migrate(args: argparse.Namespace) -> int:
    source = find_config_file(args.path)
    text = json.dumps(migrate_document(args.path), indent=2, ensure_ascii=False) + "\n"
    if args.output and Path(args.output).exists() and not args.force:
        same = Path(args.output).resolve() == source.resolve()
        what = "is the source config" if same else "exists"
        raise GenaiRuntimeError(f"{args.output} {what}: pass --force to overwrite it")
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


# ---------------------------------------------------------------------------------------------
# run / chat / bench


@dataclass
class Timing:
    """One generation's timings, in seconds; decode covers the tokens after the first."""

    prompt_tokens: int
    new_tokens: int
    prefill_s: float
    first_token_s: float
    decode_s: float

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else float("inf")

    @property
    def decode_tok_s(self) -> float | None:
        if self.new_tokens < 2:
            return None
        return (self.new_tokens - 1) / self.decode_s if self.decode_s > 0 else float("inf")

    @property
    def ttft_ms(self) -> float:
        return (self.prefill_s + self.first_token_s) * 1000.0


def timed_generate(
    generator: Any,
    ids: np.ndarray,
    on_token: Callable[[int], None] | None = None,
    limit: int | None = None,
) -> Timing:
    """Append the prompt and generate until done (or ``limit`` tokens), timing each phase.

    Only the generator calls are timed: printing the text is left out of the figures.
    """
    start = time.perf_counter()
    generator.append_tokens(ids)
    prefill = time.perf_counter() - start
    first = decode = 0.0
    count = 0
    while not generator.is_done() and (limit is None or count < limit):
        tick = time.perf_counter()
        generator.generate_next_token()
        spent = time.perf_counter() - tick
        if count == 0:
            first = spent
        else:
            decode += spent
        count += 1
        if on_token is not None:
            on_token(int(generator.get_next_tokens()[0]))
    return Timing(len(ids), count, prefill, first, decode)


def _load(model_dir: str, trust: bool = False) -> tuple[Any, Any]:
    from .importer.cache import resolve_model_dir
    from .model import Model
    from .tokenizer import Tokenizer

    # A folder, or the name of a pulled model.
    model = Model(resolve_model_dir(model_dir), trust_remote_code=trust)
    return model, Tokenizer(model)


def cmd_run(args: argparse.Namespace) -> int:
    from .generator import Generator, GeneratorParams

    model, tokenizer = _load(args.model_dir, args.trust_remote_code)
    if args.audio is not None and args.prompt is None:
        args.prompt = TRANSCRIBE_PROMPT
    if args.chat or args.system is not None:
        messages = [{"role": "user", "content": args.prompt}]
        if args.system is not None:
            messages.insert(0, {"role": "system", "content": args.system})
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    else:
        text = args.prompt
    ids = np.asarray(tokenizer.encode(text)).reshape(-1)
    options = _search_options(args)
    context = model.spec.model.context_length
    if context and len(ids) >= context:
        raise GenerationError(
            f"the prompt is {len(ids)} tokens; the model's context_length is {context}"
        )
    if args.max_new_tokens is not None:
        # Clamped: more new tokens than the context holds just means "until the context ends".
        options["max_length"] = len(ids) + args.max_new_tokens
        if context:
            options["max_length"] = min(options["max_length"], context)
    elif args.max_length is not None:
        options["max_length"] = args.max_length
    params = GeneratorParams(model)
    params.set_search_options(**options)
    if args.json_schema is not None:
        params.set_guidance("json_schema", Path(args.json_schema).read_text(encoding="utf-8"))
    elif args.lark is not None:
        params.set_guidance("lark_grammar", Path(args.lark).read_text(encoding="utf-8"))
    elif args.regex is not None:
        params.set_guidance("regex", args.regex)
    generator = Generator(model, params)
    if args.audio is not None:
        from .multimodal import Audios

        inputs = model.create_multimodal_processor()(audios=Audios.open(args.audio))
        for name, tensor in inputs.items():
            generator.set_model_input(name, tensor)
    stream = tokenizer.create_stream()
    eos = {int(t) for t in model.spec.tokens.eos}

    def show(token: int) -> None:
        if token in eos:
            return
        chunk = stream.decode(token)
        if chunk:
            sys.stdout.write(chunk)
            sys.stdout.flush()

    timing = timed_generate(generator, ids, show)
    sys.stdout.write("\n")
    sys.stdout.flush()
    print(_stats_line(timing), file=sys.stderr)
    return 0


def _stats_line(t: Timing) -> str:
    decode = f"{t.decode_tok_s:.1f} tok/s" if t.decode_tok_s is not None else "n/a"
    return (
        f"prompt tokens: {t.prompt_tokens} | prefill: {t.prefill_tok_s:.1f} tok/s | "
        f"decode: {decode} ({t.new_tokens} new tokens) | "
        f"time to first token: {t.ttft_ms:.1f} ms"
    )


def cmd_chat(args: argparse.Namespace) -> int:
    from .chat import ChatSession

    model, tokenizer = _load(args.model_dir, args.trust_remote_code)
    options = _search_options(args)
    if args.max_length is not None:
        options["max_length"] = args.max_length
    session = ChatSession(
        model, tokenizer, system=args.system, max_new_tokens=args.max_new_tokens, **options
    )
    out = sys.stdout
    while True:
        out.write("> ")
        out.flush()
        line = sys.stdin.readline()
        if not line:  # EOF
            out.write("\n")
            break
        text = line.strip()
        if not text:
            continue
        if text == "/quit":
            break
        if text == "/reset":
            session.reset()
            out.write("(conversation cleared)\n")
            continue
        try:
            for chunk in session.send(text):
                out.write(chunk)
                out.flush()
        except GenerationError as exc:  # e.g. the conversation outgrew max_length: keep going
            print(f"error: {exc}", file=sys.stderr)
            continue
        out.write("\n")
    out.flush()
    return 0


def _bench_prompt(tokenizer: Any, args: argparse.Namespace) -> np.ndarray:
    if args.prompt is not None:
        return np.asarray(tokenizer.encode(args.prompt)).reshape(-1)
    want = args.prompt_tokens or 32
    ids = np.asarray(tokenizer.encode(_FILLER * want)).reshape(-1)
    return ids[:want]


def cmd_serve(args: argparse.Namespace) -> int:
    if args.ray:
        from .integrations.ray.serve import serve_until_interrupted

        serve_until_interrupted(
            args.model_dir, replicas=args.replicas or 1, threads=args.threads or 1,
            host=args.host, port=args.port, api_key=args.api_key, insecure=args.insecure,
            served_name=args.served_name, max_queued=args.max_queued,
            max_active=args.max_active, max_context=args.max_context, timeout=args.timeout,
            batched=False if args.interleave else None,
        )  # fmt: skip
        return 0
    if args.replicas is not None or args.threads is not None:
        raise GenaiRuntimeError("--replicas and --threads are for --ray")
    from .server import serve

    serve(
        args.model_dir, host=args.host, port=args.port, api_key=args.api_key,
        insecure=args.insecure, served_name=args.served_name, max_queued=args.max_queued,
        max_active=args.max_active, max_context=args.max_context, timeout=args.timeout,
        batched=False if args.interleave else None,
    )  # fmt: skip
    return 0


def peak_rss_mib() -> float:
    """Peak resident set size of this process (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def cmd_bench(args: argparse.Namespace) -> int:
    from .generator import Generator, GeneratorParams

    model, tokenizer = _load(args.model_dir, args.trust_remote_code)
    ids = _bench_prompt(tokenizer, args)
    total = len(ids) + args.new_tokens
    timings: list[Timing] = []
    for i in range(args.warmup + args.runs):
        params = GeneratorParams(model)
        # min_length == max_length: EOS is suppressed, so every run makes exactly new_tokens.
        params.set_search_options(max_length=total, min_length=total)
        generator = Generator(model, params)
        timing = timed_generate(generator, ids)
        if i >= args.warmup:
            timings.append(timing)
    cache = generator.kv_cache
    result = {
        "model": str(args.model_dir),
        "prompt_tokens": len(ids),
        "new_tokens": args.new_tokens,
        "runs": args.runs,
        "warmup": args.warmup,
        "prefill_tok_s": statistics.median(t.prefill_tok_s for t in timings),
        "decode_tok_s": statistics.median(t.decode_tok_s or 0.0 for t in timings),
        "ttft_ms": statistics.median(t.ttft_ms for t in timings),
        "peak_rss_mib": peak_rss_mib(),
        "kv_cache": None
        if cache is None
        else {
            "kind": cache.kind,
            "length": cache.length,
            "capacity": cache.capacity,
            "nbytes": cache.nbytes,
        },
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"model: {result['model']}")
    print(
        f"prompt {result['prompt_tokens']} tokens, {args.new_tokens} new tokens, "
        f"{args.runs} runs after {args.warmup} warmup (medians):"
    )
    print(f"  prefill:             {result['prefill_tok_s']:.1f} tok/s")
    print(f"  decode:              {result['decode_tok_s']:.1f} tok/s")
    print(f"  time to first token: {result['ttft_ms']:.1f} ms")
    print(f"  peak RSS:            {result['peak_rss_mib']:.1f} MiB")
    kv = result["kv_cache"]
    if kv:
        print(
            f"  KV cache:            {kv['kind']}, {kv['nbytes'] / 2**20:.2f} MiB after "
            f"{kv['length']} tokens (capacity {kv['capacity']})"
        )
    return 0
