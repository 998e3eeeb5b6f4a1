"""Arguments several commands share, and loading a model by folder or pulled name."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def add_search_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--do-sample", action="store_true", default=None, help="sample (not greedy)")
    p.add_argument("--top-k", type=int, metavar="K")
    p.add_argument("--top-p", type=float, metavar="P")
    p.add_argument("--temperature", type=float, metavar="T")
    p.add_argument("--repetition-penalty", type=float, metavar="R")
    p.add_argument("--seed", type=int, metavar="S", help="random seed for sampling")
    p.add_argument("--min-length", type=int, metavar="N", help="minimum total length")
    p.add_argument("--no-repeat-ngram-size", type=int, metavar="N")


def search_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        option: getattr(args, flag)
        for flag, option in SEARCH_FLAGS.items()
        if getattr(args, flag) is not None
    }


def add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        metavar="DEVICE",
        help="execution provider to run on: cpu, cuda, cuda:N, dml, ... (default: the model "
        "folder's session_options.provider_options, else cpu)",
    )


def model_config(path: str, device: str | None = None) -> Any:
    """The folder's ``Config``, its providers replaced by ``device`` when one is given."""
    from ..model import Config

    config = Config(path)
    if device:
        config.use_device(device)
    return config


def load_model(
    model_dir: str, trust: bool = False, device: str | None = None, verify: bool = False
) -> tuple[Any, Any]:
    """The model and its tokenizer, from a folder or the name of a pulled model.

    A folder an import wrote is first checked against the file hashes it recorded: sizes and
    modification times (a changed file is hashed), or every file's hash with ``verify``."""
    from ..folder_hashes import verify_folder
    from ..importer.cache import resolve_model_dir
    from ..model import Model
    from ..tokenizer import Tokenizer

    path = Path(resolve_model_dir(model_dir))
    if path.is_dir() or path.is_file():  # else Model names what is wrong with the path
        verify_folder(path if path.is_dir() else path.parent, full=verify)
    config = model_config(str(path), device)
    model = Model(config, trust_remote_code=trust)
    return model, Tokenizer(model)
