"""``serve``: the OpenAI-compatible HTTP server (needs the ``server`` extra)."""

from __future__ import annotations

import argparse
import math
from typing import Any

from ..batching.prompt_cache import DEFAULT_MEMORY_MB
from ..batching.prompt_files import DEFAULT_DISK_MB
from ..batching.speculation import MAX_DRAFTS
from ..extras import require_extra
from ..server.access_log import LOG_LEVELS
from .common import (
    THREADS_HELP,
    add_device_arg,
    add_threads_arg,
    at_least,
    model_path,
    positive_int,
)


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (needs the server extra)")
    p.add_argument("model_dir", metavar="MODEL", help="model folder or pulled name")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=at_least(0, 65535), default=8000, help="0 picks a free port")
    p.add_argument("--api-key", metavar="K", help="require Authorization: Bearer K")
    p.add_argument(
        "--insecure", action="store_true", help="allow a non-loopback host without an API key"
    )
    p.add_argument("--served-name", metavar="NAME", help="model name (default: folder name)")
    p.add_argument("--max-queued", type=positive_int, default=16, metavar="N",
                   help="requests waiting for a slot before 429 (default 16)")  # fmt: skip
    p.add_argument("--max-active", type=positive_int, default=4, metavar="N",
                   help="requests decoding together (default 4)")  # fmt: skip
    p.add_argument("--max-context", type=positive_int, metavar="N",
                   help="cap on prompt + max_tokens (default 2048)")  # fmt: skip
    p.add_argument("--timeout", type=_seconds, metavar="S",
                   help="per-request timeout (default 600)")  # fmt: skip
    p.add_argument("--interleave", action="store_true", help="no batched decode")
    p.add_argument("--prompt-cache-mb", type=at_least(0), default=DEFAULT_MEMORY_MB, metavar="N",
                   help="memory for prompt keys/values shared by every request (default "
                   f"{DEFAULT_MEMORY_MB}; 0: off)")  # fmt: skip
    p.add_argument("--prompt-cache-dir", metavar="DIR",
                   help="keep the prompt cache in DIR too, across restarts")  # fmt: skip
    p.add_argument("--prompt-cache-disk-mb", type=positive_int, default=DEFAULT_DISK_MB,
                   metavar="N",
                   help=f"disk for --prompt-cache-dir (default {DEFAULT_DISK_MB})")  # fmt: skip
    p.add_argument("--speculate", type=at_least(0, MAX_DRAFTS), default=0, metavar="N",
                   help="prompt-lookup speculation: verify up to N drafted tokens per request "
                   "per pass, batched (0: off, the default; on costs a second copy of the "
                   "weights in memory)")  # fmt: skip
    p.add_argument("--draft-model", metavar="DIR",
                   help="with --speculate: a smaller model folder of the same tokenizer whose "
                   "greedy tokens are the drafts, for every request at once")  # fmt: skip
    add_device_arg(p)
    p.add_argument(
        "--special-tokens-in-messages", action="store_true",
        help="read special-token text typed in chat messages (<|im_end|>) as control tokens; "
        "by default it is plain text, so a message cannot forge a turn",
    )  # fmt: skip
    p.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="info",
        help="stderr log level (default info: one access line per request, never prompt text)",
    )
    p.add_argument(
        "--adapter", action="append", type=_adapter, default=[], metavar="NAME=PATH",
        help="a LoRA adapter (.onnx_adapter) served as <served name>:NAME; repeatable",
    )  # fmt: skip
    p.add_argument("--ray", action="store_true",
                   help="run as a Ray Serve deployment (needs the ray extra)")  # fmt: skip
    p.add_argument("--replicas", type=positive_int, metavar="N",
                   help="with --ray: replicas, one model each (default 1)")  # fmt: skip
    add_threads_arg(p, THREADS_HELP + "; with --ray: threads (and CPUs) per replica, default 1")
    p.set_defaults(func=cmd_serve, check=_check)


def _check(args: argparse.Namespace) -> str | None:
    if not args.ray and args.replicas is not None:
        return "serve: --replicas is for --ray"
    if args.api_key is not None and not args.api_key.strip():
        return "serve: --api-key is blank (a key anyone can send); give a real key or none"
    if args.draft_model is not None and not args.speculate:
        return "serve: --draft-model needs --speculate N (the most drafts per pass)"
    names = [name for name, _ in args.adapter]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        return f"serve: --adapter names {', '.join(twice)} more than once (each name one file)"
    return None


def _engine_extras(args: argparse.Namespace) -> dict[str, Any]:
    """The prompt cache's and speculation's options."""
    return dict(prompt_cache_mb=args.prompt_cache_mb, prompt_cache_dir=args.prompt_cache_dir,
                prompt_cache_disk_mb=args.prompt_cache_disk_mb,
                speculate=args.speculate, draft_model=args.draft_model)  # fmt: skip


def cmd_serve(args: argparse.Namespace) -> int:
    if args.ray:  # Ray Serve replicas of the same app (Ray's own logging; no --log-level)
        require_extra("ray", "serve --ray")
        from ..integrations.ray.serve import serve_until_interrupted

        serve_until_interrupted(
            model_path(args.model_dir), replicas=args.replicas or 1, threads=args.threads or 1,
            host=args.host, port=args.port, api_key=args.api_key, insecure=args.insecure,
            served_name=args.served_name, max_queued=args.max_queued,
            max_active=args.max_active, max_context=args.max_context, timeout=args.timeout,
            batched=False if args.interleave else None,
            special_tokens_in_messages=args.special_tokens_in_messages, device=args.device,
            adapters=dict(args.adapter), **_engine_extras(args),
        )  # fmt: skip
        return 0
    require_extra("server", "serve")
    from ..server import serve  # Starlette and uvicorn: the server extra, only when serving

    serve(
        model_path(args.model_dir), log_level=args.log_level, host=args.host, port=args.port,
        api_key=args.api_key, insecure=args.insecure, served_name=args.served_name,
        max_queued=args.max_queued, max_active=args.max_active, max_context=args.max_context,
        timeout=args.timeout, batched=False if args.interleave else None,
        special_tokens_in_messages=args.special_tokens_in_messages, device=args.device,
        adapters=dict(args.adapter), **_engine_extras(args), threads=args.threads,
    )  # fmt: skip
    return 0


def _seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


def _adapter(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path or ":" in name:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH (a NAME without ':'), got {text!r}")
    return name, path
