"""``run`` (one prompt, streamed) and ``bench`` (prefill / decode speed and memory)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..batching.core import TokenHistory
from ..batching.prompt_files import FileFormat, write_file
from ..decoding.stopping import StopPolicy, StopReason, StopRule
from ..errors import GenaiRuntimeError, GenerationError, UnsupportedError
from ..extras import require_extra
from ..generation_defaults import defaults_for
from ..generator import Generator, GeneratorParams
from ..multimodal.processor import TRANSCRIBE_PROMPT
from ..timing import Timing, peak_rss_mib, timed_generate
from .common import (
    SAMPLING_RULE,
    add_device_arg,
    add_search_args,
    add_threads_arg,
    add_trust_arg,
    at_least,
    cli_search_options,
    load_model,
    positive_int,
    search_options,
)

_FILLER = "The quick brown fox jumps over the lazy dog. "


RUN_DESCRIPTION = (
    "Generate text for one prompt and stream it to stdout (timings on stderr). The prompt is "
    "the PROMPT argument, -p TEXT, -f FILE, or stdin (PROMPT '-', or a pipe when no prompt is "
    "given). A model whose folder has a chat template answers through it (--raw sends the text "
    f"as it is). {SAMPLING_RULE}."
)


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "run", help="generate text for one prompt, streamed", description=RUN_DESCRIPTION
    )
    p.add_argument("model_dir", metavar="MODEL", help="model folder, config file or pulled name")
    p.add_argument(
        "text", nargs="?", metavar="PROMPT", help="prompt text; - reads the prompt from stdin"
    )
    add_trust_arg(p)
    add_device_arg(p)
    add_threads_arg(p)
    p.add_argument(
        "--verify",
        action="store_true",
        help="hash every file an import recorded (default: size and mtime) before running",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument("-p", "--prompt", help="prompt text")
    source.add_argument("-f", "--file", metavar="FILE", help="read the prompt from FILE")
    p.add_argument(
        "--audio",
        metavar="FILE",
        help="audio file for a speech model (wav/flac/ogg/mp3; needs the 'audio' extra), of any "
        "length; the prompt defaults to Whisper's transcription prompt",
    )
    template = p.add_mutually_exclusive_group()
    template.add_argument(
        "--chat",
        action="store_true",
        help="apply the model's chat template (the default when the folder has one)",
    )
    template.add_argument(
        "--raw", action="store_true", help="send the prompt as it is, without the chat template"
    )
    p.add_argument("--system", metavar="TEXT", help="system message (needs the chat template)")
    lengths = p.add_mutually_exclusive_group()
    lengths.add_argument(
        "--max-length", type=positive_int, metavar="N", help="total length, prompt included"
    )
    lengths.add_argument(
        "--max-new-tokens", type=positive_int, metavar="N", help="max_length = prompt length + N"
    )
    add_search_args(p)
    guide = p.add_mutually_exclusive_group()
    guide.add_argument(
        "--json-schema", metavar="FILE", help="constrain the output to a JSON schema"
    )
    guide.add_argument("--regex", metavar="PATTERN", help="constrain the output to a regex")
    guide.add_argument("--lark", metavar="FILE", help="constrain the output to a Lark grammar")
    p.add_argument(
        "--prompt-cache",
        metavar="FILE",
        help="keys/values of an earlier prompt: the longest prefix this prompt shares with it "
        "is copied, not run; a missing FILE, or one another model or setting wrote, is "
        "written with this prompt's after the run",
    )
    p.set_defaults(func=cmd_run, check=_check_run, late_positional="text")

    p = sub.add_parser("bench", help="measure prefill / decode speed and memory")
    p.add_argument("model_dir", metavar="MODEL_DIR")
    add_trust_arg(p)
    add_device_arg(p)
    add_threads_arg(p)
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", metavar="TEXT", help="prompt text")
    prompt.add_argument(
        "--prompt-tokens",
        type=positive_int,
        metavar="N",
        default=None,
        help="a synthetic prompt of exactly N tokens (default 32)",
    )
    p.add_argument(
        "--new-tokens",
        type=at_least(2),
        default=32,
        metavar="N",
        help="tokens generated per run, exactly (default 32)",
    )
    p.add_argument(
        "--runs", type=positive_int, default=3, metavar="N", help="timed runs (default 3)"
    )
    p.add_argument(
        "--warmup", type=at_least(0), default=1, metavar="N", help="untimed runs first (default 1)"
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=cmd_bench)


def _check_run(args: argparse.Namespace) -> str | None:
    given = [args.text is not None, args.prompt is not None, args.file is not None]
    if sum(given) > 1:
        return "run: give the prompt once (PROMPT, -p TEXT or -f FILE)"
    if args.raw and args.system is not None:
        return "run: --system needs the chat template (drop --raw)"
    if args.audio is not None and args.prompt_cache is not None:
        return "run: --prompt-cache keeps a text prompt's keys/values, not audio's (drop one)"
    try:
        args.prompt = _prompt_text(args)
    except OSError as exc:  # -f FILE unreadable, or no usable stdin
        return f"run: cannot read the prompt from {exc.filename or 'stdin'}: {exc.strerror or exc}"
    except UnicodeDecodeError as exc:
        return f"run: the prompt is not UTF-8 text: {exc}"
    if args.prompt is None and args.audio is None:
        if sys.stdin.isatty() and not (args.raw or args.json_schema or args.regex or args.lark):
            args.open_chat = True  # `run MODEL` at a terminal opens a chat, as ollama's does
            return None
        return "run: give a prompt (PROMPT, -p TEXT, -f FILE or stdin) or an audio file (--audio)"
    if args.prompt is not None and not args.prompt.strip() and args.audio is None:
        return "run: the prompt is empty"
    return None


def _prompt_text(args: argparse.Namespace) -> str | None:
    """The prompt from PROMPT, -p, -f FILE, or stdin ('-', or a pipe when none is given)."""
    if args.prompt is not None:
        return args.prompt
    if args.file is not None:
        return _one_line_end_off(Path(args.file).read_text(encoding="utf-8"))
    if args.text is not None and args.text != "-":
        return args.text
    if args.text == "-" or (args.audio is None and not sys.stdin.isatty()):
        return _one_line_end_off(sys.stdin.read())
    return None


def _one_line_end_off(text: str) -> str:
    # A file or `echo` ends its last line; that newline is not part of the prompt.
    return text.removesuffix("\n").removesuffix("\r")


def _extras_needed(args: argparse.Namespace) -> None:
    if args.audio is not None:
        require_extra("audio", "--audio")
    if args.json_schema is not None or args.regex is not None or args.lark is not None:
        require_extra("constrained", "constrained output (--json-schema, --regex, --lark)")


def cmd_run(args: argparse.Namespace) -> int:
    if getattr(args, "open_chat", False):
        from .chat import cmd_chat

        return cmd_chat(args)
    _extras_needed(args)
    model, tokenizer = load_model(
        args.model_dir,
        args.trust_remote_code,
        args.device,
        verify=args.verify,
        threads=args.threads,
    )
    if args.audio is not None and args.prompt is None:
        args.prompt = TRANSCRIBE_PROMPT
    constrained = (args.json_schema, args.lark, args.regex, args.max_new_tokens, args.max_length)
    if (
        args.audio is not None
        and not args.chat
        and args.system is None
        and constrained == (None,) * 5
    ):
        # Model.transcribe reads audio of any length (window by window past 30 s).
        print(model.transcribe(args.audio, prompt=args.prompt, **search_options(args)))
        return 0
    templated = args.chat or args.system is not None
    if templated and not tokenizer.has_chat_template:
        flag = "--chat" if args.chat else "--system"
        raise UnsupportedError(
            f"run: {args.model_dir} has no chat template (a base model?), so {flag} cannot "
            "apply one; drop it to send the prompt as it is"
        )
    if not (templated or args.raw or args.audio is not None):
        templated = tokenizer.has_chat_template
    if templated:
        messages = [{"role": "user", "content": args.prompt}]
        if args.system is not None:
            messages.insert(0, {"role": "system", "content": args.system})
        ids = tokenizer.encode_chat(messages)
    elif args.audio is not None:  # the decoder prompt exactly as the processor builds it
        ids = tokenizer.encode(args.prompt)
    else:
        ids = tokenizer.encode_prompt(args.prompt)
    ids = np.asarray(ids).reshape(-1)
    # Speech keeps the config's decoding (greedy, as Whisper is run); text gets the defaults.
    defaults = defaults_for(model.spec)
    text = args.audio is None
    options = cli_search_options(args, defaults) if text else search_options(args)
    context = model.spec.model.context_length
    if context and len(ids) >= context:
        raise GenerationError(
            f"the prompt is {len(ids)} tokens; the model's context_length is {context}"
        )
    new_tokens = args.max_new_tokens
    if new_tokens is None and args.max_length is None and text:
        new_tokens = defaults.max_new_tokens
    if new_tokens is not None:
        # Clamped: more new tokens than the context holds just means "until the context ends".
        options["max_length"] = len(ids) + new_tokens
        if context:
            options["max_length"] = min(options["max_length"], context)
    elif args.max_length is not None:
        if args.max_length <= len(ids):
            raise GenerationError(
                f"run: the prompt is {len(ids)} tokens, so --max-length {args.max_length} leaves "
                "no room for a reply (--max-new-tokens N counts the reply alone)"
            )
        options["max_length"] = args.max_length
    params = GeneratorParams(model)
    params.set_search_options(**options)
    if args.json_schema is not None:
        params.set_guidance("json_schema", Path(args.json_schema).read_text(encoding="utf-8"))
        params.guidance_source = f"--json-schema {args.json_schema}"
    elif args.lark is not None:
        params.set_guidance("lark_grammar", Path(args.lark).read_text(encoding="utf-8"))
        params.guidance_source = f"--lark {args.lark}"
    elif args.regex is not None:
        params.set_guidance("regex", args.regex)
        params.guidance_source = "--regex"
    generator = Generator(model, params)
    if args.audio is not None:
        from ..multimodal import Audios  # the audio extra, only when asked for

        inputs = model.create_multimodal_processor()(audios=Audios.open(args.audio))
        for name, tensor in inputs.items():
            generator.set_model_input(name, tensor)
    stream = tokenizer.create_stream()
    guard = 0 if args.no_loop_guard or not text else defaults.loop_span
    stop = StopRule(model.spec.tokens.eos, policy=StopPolicy(loop_span=guard))
    reply = TokenHistory()
    reasons: list[StopReason] = []

    def show(token: int) -> bool:
        reply.append(token)
        reason = stop.check(token, generated=len(reply), length=0, budget=new_tokens,
                            reply=reply.array())  # fmt: skip
        if reason is not StopReason.EOS:  # an EOS ends the row; its text is not the reply's
            chunk = stream.decode(token)
            if chunk:
                sys.stdout.write(chunk)
                sys.stdout.flush()
        if reason is not None:
            reasons.append(reason)
        return reason is StopReason.LOOP

    cache = Path(args.prompt_cache) if args.prompt_cache is not None else None
    reused, write = _from_prompt_file(cache, model, generator, ids) if cache else (0, False)
    timing = timed_generate(generator, ids[reused:], show)
    sys.stdout.write("\n")
    sys.stdout.flush()
    if write:
        _to_prompt_file(cache, model, generator, ids)
    if reasons and reasons[-1] is StopReason.LOOP:
        print("note: the reply kept repeating itself, so it was ended (--no-loop-guard lets "
              "it run on)", file=sys.stderr)  # fmt: skip
    elif reasons and reasons[-1] is StopReason.BUDGET and args.max_new_tokens is None:
        print(f"note: cut at {new_tokens} new tokens (--max-new-tokens N for more)",
              file=sys.stderr)  # fmt: skip
    print(timing.line(), file=sys.stderr)
    return 0


def _from_prompt_file(
    path: Path, model: Any, generator: Generator, ids: np.ndarray
) -> tuple[int, bool]:
    """Copy the rows of the longest prefix the prompt shares with ``path`` into the new
    generator, leaving at least two tokens to run (as the prompt is run without the file, so
    the logits are the same); returns the tokens reused and whether to write ``path`` after."""
    why = generator.kv_copy_obstacle
    if why is not None:
        print(f"warning: --prompt-cache is not used: {why}", file=sys.stderr)
        return 0, False
    if not path.exists():
        return 0, True
    context = model.spec.model.context_length or model.spec.generation.max_length
    try:
        fmt = FileFormat.single(model, generator.kv_rows)
        tokens, rows = fmt.read(path, max_tokens=context, max_bytes=fmt.max_bytes(context),
                                follow_links=True)  # fmt: skip
    except (OSError, ValueError) as exc:
        print(f"warning: prompt cache {path} is not used ({exc}): the whole prompt runs, and "
              "the file is written anew after", file=sys.stderr)  # fmt: skip
        return 0, True
    n = max(0, min(tokens.size, len(ids) - 2))
    differ = np.flatnonzero(tokens[:n] != ids[:n])
    common = int(differ[0]) if differ.size else n
    if common:
        generator.append_kv(ids[:common], rows[:, :, :common])
    print(f"prompt cache: reused {common} of {len(ids)} prompt tokens from {path}",
          file=sys.stderr)  # fmt: skip
    return common, False


def _to_prompt_file(path: Path, model: Any, generator: Generator, ids: np.ndarray) -> None:
    """Write the prompt's tokens and keys/values to ``path`` (a warning if it cannot be)."""
    try:
        rows = generator.read_kv(0, len(ids))
        write_file(path, FileFormat.single(model, generator.kv_rows).encode(ids, rows))
    except (OSError, GenaiRuntimeError) as exc:
        print(f"warning: prompt cache {path} could not be written: {exc}", file=sys.stderr)
        return
    print(f"prompt cache: wrote {len(ids)} prompt tokens to {path}", file=sys.stderr)


def _bench_prompt(tokenizer: Any, args: argparse.Namespace) -> np.ndarray:
    if args.prompt is not None:
        return np.asarray(tokenizer.encode(args.prompt)).reshape(-1)
    want = args.prompt_tokens or 32
    ids = np.asarray(tokenizer.encode(_FILLER * want)).reshape(-1)
    return ids[:want]


KV_TOKENS = 512  # the context at which bench counts the keys/values a decode step reads


def _weight_footprint(model: Any) -> dict[str, Any] | None:
    """The decoder graph's weight bytes per decode step and bits per weight (``show`` prints
    the same), the keys/values a step reads at ``KV_TOKENS`` tokens, and, for a folder imported
    from a GGUF file still on disk, what a step over that file's tensors reads; when the files
    can be read (onnx and gguf, the gguf extra's, are installed)."""
    decoder = model.spec.sessions.get("decoder")
    if decoder is None or not decoder.file:
        return None
    try:
        from ..importer.footprint import footprint, gguf_bytes_per_token

        out = footprint(Path(model.model_dir) / decoder.file).describe()
    except Exception:  # no onnx, or a graph it cannot parse: bench times it all the same
        return None
    layout = model.pipeline.plan.layout
    if layout is not None:
        out["kv_bytes_at_512_mib"] = round(layout.bytes_per_token(1) * KV_TOKENS / 2**20, 1)
    record = Path(model.model_dir) / "import.json"
    try:
        source = json.loads(record.read_text(encoding="utf-8")).get("source", "")
        if str(source).endswith(".gguf") and Path(source).is_file():
            out["gguf_bytes_per_token_mib"] = round(gguf_bytes_per_token(source) / 2**20, 1)
    except Exception:  # no record, or a source that moved or cannot be read: ours alone
        pass
    return out


def cmd_bench(args: argparse.Namespace) -> int:
    model, tokenizer = load_model(
        args.model_dir, args.trust_remote_code, args.device, threads=args.threads
    )
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
        "weights": _weight_footprint(model),
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
    weights = result["weights"]
    if weights:
        print(
            f"  weights read/token: {weights['weight_bytes_per_token_mib']:.1f} MiB "
            f"({weights['bits_per_weight']:.2f} bits per weight)"
        )
        if "kv_bytes_at_512_mib" in weights:
            print(f"  KV read/token:       {weights['kv_bytes_at_512_mib']:.1f} MiB at "
                  f"{KV_TOKENS} tokens")  # fmt: skip
        if "gguf_bytes_per_token_mib" in weights:
            print(f"  the GGUF's tensors:  {weights['gguf_bytes_per_token_mib']:.1f} MiB read "
                  "per token by a step over the source file")  # fmt: skip
    kv = result["kv_cache"]
    if kv:
        print(
            f"  KV cache:            {kv['kind']}, {kv['nbytes'] / 2**20:.2f} MiB after "
            f"{kv['length']} tokens (capacity {kv['capacity']})"
        )
    return 0
