"""``chat``: an interactive conversation; the KV cache is kept between turns.

At a terminal, lines are read with ``readline`` (editing, and a history file in the user's cache
folder); piped input is read line by line. Ctrl-C while a reply streams stops it and forgets that
turn (the cache rewinds to the last whole turn); Ctrl-C at the prompt, a second Ctrl-C during a
reply, or Ctrl-D leaves. Replies go to stdout; the banner, notices and errors to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from ..chat import ChatSession, ConversationFull
from ..config.pulled import user_cache_dir
from ..errors import GenerationError
from ..generation_defaults import DEFAULT_MAX_NEW_TOKENS, defaults_for
from .common import (
    SAMPLING_RULE,
    add_device_arg,
    add_search_args,
    add_threads_arg,
    add_trust_arg,
    cli_search_options,
    load_model,
    positive_int,
)

COMMANDS = {
    "/help": "list these commands",
    "/reset": "forget the conversation (the system message stays)",
    "/system TEXT": "set the system message (/system alone shows it)",
    "/save FILE": "write the conversation to FILE as JSON messages",
    "/quit": "leave (so do Ctrl-D, and Ctrl-C at the prompt)",
}
HISTORY_FILE = "chat_history"
_HISTORY_LINES = 1000


def _command_list() -> str:
    return "\n".join(f"  {name:<14} {what}" for name, what in COMMANDS.items())


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "chat",
        help="interactive multi-turn chat",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Chat with a model; the KV cache is kept between turns.\n"
        "At a terminal, lines have editing and a history (in the user's cache folder).\n"
        "Ctrl-C stops a reply and forgets that turn; Ctrl-C again, or Ctrl-D, leaves.\n"
        "When the context fills, the oldest turns are dropped (the system message stays).\n\n"
        "commands:\n" + _command_list(),
        epilog=SAMPLING_RULE + ".",
    )
    p.add_argument("model_dir", metavar="MODEL", help="model folder, config file or pulled name")
    add_trust_arg(p)
    add_device_arg(p)
    add_threads_arg(p)
    p.add_argument("--system", metavar="TEXT", help="system message")
    p.add_argument(
        "--max-length",
        type=positive_int,
        metavar="N",
        help="bound on the whole conversation, in tokens (the context)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=positive_int,
        metavar="N",
        help=f"cap on each reply, in tokens (default {DEFAULT_MAX_NEW_TOKENS})",
    )
    add_search_args(p)
    p.set_defaults(func=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    model, tokenizer = load_model(
        args.model_dir, args.trust_remote_code, args.device, threads=args.threads
    )
    if not tokenizer.has_chat_template:
        print(
            f"error: chat: {args.model_dir} has no chat template (a base model?); for plain "
            f"completion run: genai-runtime run {args.model_dir} -p TEXT",
            file=sys.stderr,
        )
        return 1
    defaults = defaults_for(model.spec)
    options = cli_search_options(args, defaults)
    if args.max_length is not None:
        options["max_length"] = args.max_length
    session = ChatSession(
        model,
        tokenizer,
        system=args.system,
        max_new_tokens=args.max_new_tokens or defaults.max_new_tokens,
        drop_oldest=True,
        loop_span=0 if args.no_loop_guard else defaults.loop_span,
        **options,
    )
    print(
        f"{Path(model.model_dir).name} | context {session.max_length} tokens | /help for "
        "commands, Ctrl-C stops a reply, Ctrl-D leaves",
        file=sys.stderr,
    )
    with _LineReader(sys.stdin.isatty()) as lines:
        for text in lines:
            if text.startswith("/"):
                if not _command(session, text):
                    break
                continue
            _turn(session, text, sys.stdout)
    return 0


def _turn(session: ChatSession, text: str, out: TextIO) -> None:
    with _StopOnInterrupt() as interrupt:
        try:
            reply = session.send(text)
        except ConversationFull as exc:  # the message alone outgrew the context: keep going
            after = " after dropping every earlier turn" if exc.dropped else ""
            print(
                f"error: the conversation no longer fits the context of {exc.max_length} tokens: "
                f"it is {exc.tokens} with that message{after}; /reset starts over, or restart "
                "chat with a larger --max-length",
                file=sys.stderr,
            )
            return
        except GenerationError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return
        if session.dropped_turns:
            n = session.dropped_turns
            turns = "the oldest turn" if n == 1 else f"the {n} oldest turns"
            print(f"(the context is full: dropped {turns})", file=sys.stderr)
        start = time.perf_counter()
        for chunk in _until(reply, interrupt):
            out.write(chunk)
            out.flush()
        seconds = time.perf_counter() - start
    if interrupt.stopped and session.abandon():
        out.write(" [stopped]\n")
        out.flush()
        print(
            "(reply stopped; that turn is forgotten. Ctrl-C again or Ctrl-D leaves)",
            file=sys.stderr,
        )
        return
    speed = _speed(len(session.last_reply_tokens), seconds)
    if session.finish_reason == "loop":
        out.write(" [ended: the reply kept repeating itself; --no-loop-guard lets it run on]")
    elif session.finish_reason == "length":
        out.write(f" [cut at {session.max_new_tokens} tokens: --max-new-tokens]")
    elif session.finish_reason == "context":
        out.write(f" [cut: the conversation reached {session.max_length} tokens]")
    out.write("\n")
    out.flush()
    print(speed, file=sys.stderr, flush=True)


def _speed(tokens: int, seconds: float) -> str:
    """The line after a reply: how long it was and how fast it came (prompt pass included)."""
    rate = f", {tokens / seconds:.1f} tok/s" if seconds > 0 and tokens > 1 else ""
    return f"({tokens} tokens{rate})"


def _until(reply: Iterator[str], interrupt: _StopOnInterrupt) -> Iterator[str]:
    if interrupt.stopped:  # Ctrl-C during the prompt pass
        return
    for chunk in reply:
        yield chunk
        if interrupt.stopped:
            return


def _command(session: ChatSession, text: str) -> bool:
    """Run one slash command; False when the chat should end."""
    name, _, rest = text.partition(" ")
    rest = rest.strip()
    if name in ("/quit", "/exit"):
        return False
    if name == "/help":
        print("commands:\n" + _command_list())
    elif name == "/reset":
        session.reset()
        print("(conversation cleared)")
    elif name == "/system":
        if rest:
            session.set_system(rest)
            print("(system message set)")
        else:
            shown = repr(session.system) if session.system else "none; /system TEXT sets one"
            print(f"(system message: {shown})")
    elif name == "/save":
        if not rest:
            print("usage: /save FILE", file=sys.stderr)
            return True
        try:
            Path(rest).expanduser().write_text(
                json.dumps(session.messages, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
            )
        except OSError as exc:
            print(f"error: cannot write {rest}: {exc.strerror or exc}", file=sys.stderr)
            return True
        print(f"(saved {len(session.messages)} messages to {rest})")
    else:
        print(f"unknown command {name}; /help lists the commands", file=sys.stderr)
    return True


class _StopOnInterrupt:
    """While a turn runs, the first Ctrl-C only sets ``stopped`` (checked between tokens, so the
    generator is never left half-way through a step); a second one leaves as usual."""

    def __init__(self) -> None:
        self.stopped = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.stopped:
            raise KeyboardInterrupt
        self.stopped = True

    def __enter__(self) -> _StopOnInterrupt:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)


class _LineReader:
    """Non-empty input lines, stripped; at a terminal through readline with a history file."""

    def __init__(self, interactive: bool) -> None:
        self.readline: Any = None
        self.history = user_cache_dir() / HISTORY_FILE
        if interactive:
            try:
                import readline  # line editing for input(); absent on some platforms
            except ImportError:
                readline = None
            self.readline = readline
        if self.readline is not None:
            self.readline.set_history_length(_HISTORY_LINES)
            with contextlib.suppress(OSError):  # no history yet, or unreadable: start without
                self.readline.read_history_file(self.history)

    def __enter__(self) -> _LineReader:
        return self

    def __iter__(self) -> Iterator[str]:
        while True:
            try:
                line = input("> ")
            except (EOFError, KeyboardInterrupt):
                sys.stdout.write("\n")
                return
            if line.strip():
                yield line.strip()

    def __exit__(self, *exc: object) -> None:
        sys.stdout.flush()
        if self.readline is None:
            return
        try:  # the history holds what the user typed: readable by them only
            self.history.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.history.touch(mode=0o600)
            self.readline.write_history_file(self.history)
        except OSError as exc:
            print(f"warning: chat history not saved: {exc}", file=sys.stderr)
