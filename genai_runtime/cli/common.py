"""Arguments several commands share, and loading a model by folder or pulled name."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..generation_defaults import DEFAULT_SAMPLING, LOOP_SPAN, SAMPLING_FILE, Defaults

# CLI flag -> onnxruntime-genai search option, for run / chat.
SEARCH_FLAGS = {
    "do_sample": "do_sample",
    "top_k": "top_k",
    "top_p": "top_p",
    "temperature": "temperature",
    "repetition_penalty": "repetition_penalty",
    "seed": "random_seed",
    "min_length": "min_length",
    "no_repeat_ngram_size": "no_repeat_ngram_size",
}


def at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low`` (and <= ``high`` when given)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            wanted = f">= {low}" if high is None else f"between {low} and {high}"
            raise argparse.ArgumentTypeError(f"expected an integer {wanted}, got {value}")
        return value

    return parse


positive_int = at_least(1)


def add_trust_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow code the config asks for (pipeline.controller, custom ops libraries)",
    )


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path", metavar="PATH", help="model folder, config file (JSON/YAML, v1/v2) or pulled name"
    )
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


SAMPLING_RULE = (
    "Sampling: --temperature above 0, --top-p or --top-k turn sampling on (as llama.cpp and "
    "ollama do) unless --greedy is given; --temperature 0 is greedy. With none of them: the "
    "model config's search options when they sample, else the makers' settings an import "
    f"recorded ({SAMPLING_FILE}), else temperature {DEFAULT_SAMPLING['temperature']}, top-k "
    f"{DEFAULT_SAMPLING['top_k']}, top-p {DEFAULT_SAMPLING['top_p']} (`explain` says which)"
)


def add_search_args(p: argparse.ArgumentParser) -> None:
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--do-sample", action="store_true", default=None, help="sample (not greedy)")
    mode.add_argument(
        "--greedy", action="store_true", help="always pick the most likely token (no sampling)"
    )
    p.add_argument("--top-k", type=int, metavar="K", help="sample from the K most likely tokens")
    p.add_argument("--top-p", type=float, metavar="P", help="nucleus sampling: keep mass P")
    p.add_argument("--temperature", type=float, metavar="T", help="0: greedy; above 0: sample")
    p.add_argument("--repetition-penalty", type=float, metavar="R")
    p.add_argument("--seed", type=int, metavar="S", help="random seed for sampling")
    p.add_argument("--min-length", type=int, metavar="N", help="minimum total length")
    p.add_argument("--no-repeat-ngram-size", type=int, metavar="N")
    p.add_argument(
        "--no-loop-guard",
        action="store_true",
        help=f"let a reply that repeats itself run on (default: it ends once its last "
        f"{LOOP_SPAN}+ tokens are one block repeated)",
    )


def names_sampling(args: argparse.Namespace) -> bool:
    """Whether a flag says how to choose tokens (else the defaults in force decide)."""
    flags = (args.do_sample, args.temperature, args.top_p, args.top_k)
    return args.greedy or any(flag is not None for flag in flags)


def cli_search_options(args: argparse.Namespace, defaults: Defaults) -> dict[str, Any]:
    """``search_options``, over ``defaults``' sampling when no flag names any."""
    options = search_options(args)
    if names_sampling(args):
        return options
    return {**defaults.sampling, **options}


def search_options(args: argparse.Namespace) -> dict[str, Any]:
    """The search options the flags ask for, with SAMPLING_RULE applied."""
    options = {
        option: getattr(args, flag)
        for flag, option in SEARCH_FLAGS.items()
        if getattr(args, flag) is not None
    }
    asks_to_sample = args.top_p is not None or args.top_k is not None
    if args.temperature is not None:
        asks_to_sample = args.temperature > 0
    if args.greedy:
        options["do_sample"] = False
    elif args.do_sample is None and asks_to_sample:
        options["do_sample"] = True
    return options


def model_path(name_or_path: str) -> str:
    """A model folder or config path as given, or a pulled model's folder for its name (with a
    hint to pull a known model that is not pulled yet)."""
    from ..importer.cache import resolve_model_dir

    return resolve_model_dir(name_or_path)


def add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        metavar="DEVICE",
        help="execution provider to run on: cpu, cuda, cuda:N, dml, ... (default: the model "
        "folder's session_options.provider_options, else cpu)",
    )


THREADS_HELP = (
    "onnxruntime threads per session (intra-op; default: the config's "
    "session_options.intra_op_num_threads, else onnxruntime's own, one per physical core)"
)


def add_threads_arg(p: argparse.ArgumentParser, help: str = THREADS_HELP) -> None:
    p.add_argument("--threads", type=at_least(1, 256), metavar="N", help=help)


def model_config(path: str, device: str | None = None, threads: int | None = None) -> Any:
    """The folder's ``Config``, its providers replaced by ``device`` and every session's
    intra-op threads set to ``threads`` when given."""
    from ..model import Config

    config = Config(path)
    if device:
        config.use_device(device)
    if threads is not None:
        config.set_threads(threads)
    return config


def load_model(
    model_dir: str,
    trust: bool = False,
    device: str | None = None,
    verify: bool = False,
    threads: int | None = None,
) -> tuple[Any, Any]:
    """The model and its tokenizer, from a folder or the name of a pulled model.

    A folder an import wrote is first checked against the file hashes it recorded: sizes and
    modification times (a changed file is hashed; an edited settings file is only noted), or
    every file's hash with ``verify`` (any change refused)."""
    from ..folder_hashes import verify_folder
    from ..model import Model
    from ..tokenizer import Tokenizer

    path = Path(model_path(model_dir))
    if path.is_dir() or path.is_file():  # else Model names what is wrong with the path
        folder = path if path.is_dir() else path.parent
        for note in verify_folder(folder, full=verify, lenient=not verify):
            print(f"note: {note}", file=sys.stderr)
    model = Model(model_config(str(path), device, threads), trust_remote_code=trust)
    return model, Tokenizer(model)
