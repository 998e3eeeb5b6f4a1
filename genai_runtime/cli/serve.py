"""``serve``: the OpenAI-compatible HTTP server (needs the ``server`` extra)."""

from __future__ import annotations

import argparse
from typing import Any

from .common import at_least, positive_int


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (needs the server extra)")
    p.add_argument("model_dir", metavar="MODEL_DIR")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=at_least(0, 65535), default=8000, help="0 picks a free port")
    p.add_argument("--api-key", metavar="K", help="require Authorization: Bearer K")
    p.add_argument(
        "--insecure", action="store_true", help="allow a non-loopback host without an API key"
    )
    p.add_argument("--served-name", metavar="NAME", help="model name (default: folder name)")
    p.add_argument("--max-queued", type=at_least(0), default=16, metavar="N")
    p.add_argument("--max-active", type=positive_int, default=4, metavar="N",
                   help="requests decoding together (default 4)")  # fmt: skip
    p.add_argument("--max-context", type=positive_int, metavar="N",
                   help="cap on prompt + max_tokens (default 2048)")  # fmt: skip
    p.add_argument("--timeout", type=float, metavar="S", help="per-request timeout (default 600)")
    p.add_argument("--interleave", action="store_true", help="no batched decode")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from ..server import serve  # Starlette and uvicorn: the server extra, only when serving

    serve(
        args.model_dir, host=args.host, port=args.port, api_key=args.api_key,
        insecure=args.insecure, served_name=args.served_name, max_queued=args.max_queued,
        max_active=args.max_active, max_context=args.max_context, timeout=args.timeout,
        batched=False if args.interleave else None,
    )  # fmt: skip
    return 0
