"""``genai-runtime``: validate, explain and migrate configs; run, chat with, benchmark and serve
models; import and pull GGUF models. One module per command group, each with ``add_parsers``.

Every error raised on purpose (a ``GenaiRuntimeError``) is printed as ``error: <message>`` on
stderr with exit status 1; usage errors exit 2, as argparse does.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Iterable, Sequence

from .. import __version__
from ..config import V2_SCHEMA_NAME
from ..errors import ConfigError, GenaiRuntimeError
from ..importer import commands as importer_commands
from . import chat, configs, run, serve

__all__ = ["V2_SCHEMA_NAME", "build_parser", "main"]

COMMAND_GROUPS = (configs, run, chat, serve, importer_commands)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 error, 2 usage)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = parser.commands
    if argv and not argv[0].startswith("-") and argv[0] not in commands:
        print(f"genai-runtime: unknown command {argv[0]!r}{_did_you_mean(argv[0], commands)}; "
              "genai-runtime --help lists them", file=sys.stderr)  # fmt: skip
        return 2
    try:
        args, extra = parser.parse_known_args(argv)
        # argparse fills an optional positional (run's PROMPT) before the options that follow
        # the model; a lone word left after them is that positional.
        late = getattr(args, "late_positional", None)
        lone_word = len(extra) == 1 and (extra[0] == "-" or not extra[0].startswith("-"))
        if late and getattr(args, late) is None and lone_word:
            setattr(args, late, extra.pop())
        if extra:
            flags = commands[args.command].flags
            hint = _did_you_mean(extra[0].split("=", 1)[0], flags) if extra[0][:1] == "-" else ""
            commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}{hint}")
        check = getattr(args, "check", None)
        problem = check(args) if check is not None else None
        if problem:
            parser.error(problem)
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


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


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
    parser.add_argument("--version", action="version", version=f"genai-runtime {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.add_parsers(sub)
    parser.commands = dict(sub.choices)  # name -> its parser, for "did you mean"
    for command in parser.commands.values():
        command.flags = [f for a in command._actions for f in a.option_strings]
    return parser
