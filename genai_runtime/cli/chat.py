"""``chat``: interactive multi-turn conversation over stdin; the KV cache is kept between turns."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..chat import ChatSession
from ..errors import GenerationError
from .common import (
    add_device_arg,
    add_search_args,
    add_trust_arg,
    load_model,
    positive_int,
    search_options,
)


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("chat", help="interactive multi-turn chat over stdin")
    p.add_argument("model_dir", metavar="MODEL_DIR")
    add_trust_arg(p)
    add_device_arg(p)
    p.add_argument("--system", metavar="TEXT", help="system message")
    p.add_argument(
        "--max-length",
        type=positive_int,
        metavar="N",
        help="bound on the whole conversation, in tokens",
    )
    p.add_argument(
        "--max-new-tokens", type=positive_int, metavar="N", help="cap on each reply, in tokens"
    )
    add_search_args(p)
    p.set_defaults(func=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    model, tokenizer = load_model(args.model_dir, args.trust_remote_code, args.device)
    options = search_options(args)
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
