"""``genai-runtime list`` / ``show NAME`` / ``rm NAME``: the models in the pull cache.

A model is a folder of the cache holding ``genai_config.json``; what it was made from and how
comes from the import report beside it (``import.json``; ``gguf_import.json`` before it).
Names are plain folder names: anything with a path separator, or starting with a dot, is refused,
so ``rm`` can only remove a model folder of the cache (and, unless ``--keep-gguf``, the verified
GGUF a pull kept for it).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import GenaiRuntimeError, ModelError
from ..generation_defaults import defaults_in
from .cache import cache_root
from .catalogue import SOURCES
from .folder import REPORT_FILE

OLD_REPORT = "gguf_import.json"


@dataclass(frozen=True)
class CachedModel:
    name: str
    folder: Path
    size: int  # bytes on disk
    report: dict[str, Any]

    @property
    def source(self) -> str:
        return str(self.report.get("package") or self.report.get("source") or "?")

    @property
    def quant(self) -> str:
        r = self.report
        if "quant" in r:
            return f"{r['quant']} (accuracy level {r.get('accuracy_level', '?')})"
        return str(r.get("dtype", "?"))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def model_folder(name: str, root: Path) -> Path:
    """The cache folder of model ``name``; a ``ModelError`` for a bad or unknown name."""
    if not name or os.sep in name or "/" in name or name.startswith("."):
        raise GenaiRuntimeError(f"{name!r} is not a model name (a folder name in {root})")
    folder = root / name
    if not (folder / "genai_config.json").is_file():
        hint = f"; run: genai-runtime pull {name}" if name in SOURCES else ""
        raise ModelError(f"no model {name!r} in {root}{hint}")
    return folder


def cached_models(root: Path) -> list[CachedModel]:
    if not root.is_dir():
        return []
    found = []
    for folder in sorted(root.iterdir()):
        if folder.name.startswith(".") or not (folder / "genai_config.json").is_file():
            continue
        report = _read_json(folder / REPORT_FILE) or _read_json(folder / OLD_REPORT)
        found.append(CachedModel(folder.name, folder, folder_size(folder), report))
    return found


def describe(folder: Path) -> dict[str, Any]:
    """What ``show`` prints: the config's shape, the import's settings, the tokenizer's."""
    config = _read_json(folder / "genai_config.json")
    cfg = config.get("model", {})
    dec = cfg.get("decoder", {})
    report = _read_json(folder / REPORT_FILE) or _read_json(folder / OLD_REPORT)
    tok = _read_json(folder / "tokenizer_config.json")
    template = bool(tok.get("chat_template")) or any(
        (folder / n).is_file() for n in ("chat_template.jinja", "chat_template.json")
    )
    window = dec.get("sliding_window", {})
    return {
        "folder": str(folder),
        "type": cfg.get("type"),
        "architecture": report.get("architecture"),
        "layers": dec.get("num_hidden_layers"),
        "hidden_size": dec.get("hidden_size"),
        "heads": dec.get("num_attention_heads"),
        "kv_heads": dec.get("num_key_value_heads"),
        "head_size": dec.get("head_size"),
        "vocab_size": cfg.get("vocab_size"),
        "context_length": cfg.get("context_length"),
        "sliding_window": window.get("window_size") if window else None,
        "quantisation": CachedModel("", folder, 0, report).quant,
        "weights": report.get("weights"),
        **_footprint(folder, config),
        "source": report.get("package") or report.get("source"),
        "chat_template": "yes" if template else "no",
        "run_defaults": defaults_in(
            folder, config.get("search", {}).get("do_sample") is True
        ).describe(),
        "size_mib": round(folder_size(folder) / 2**20, 1),
    }


def _footprint(folder: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Bits per weight and the weight bytes a decode step reads, from the decoder graph's
    initializers (``footprint.py``); nothing when the graph cannot be read."""
    from .footprint import footprint

    name = config.get("model", {}).get("decoder", {}).get("filename", "model.onnx")
    graph = folder / str(name)
    if not graph.is_file():
        return {}
    try:
        return footprint(graph).describe()
    except Exception:  # a graph onnx cannot parse: show says what it can
        return {}


def cmd_list(args: Any) -> int:
    root = cache_root(args.cache_dir)
    models = cached_models(root)
    if not models:
        print(f"no models in {root} (genai-runtime pull --list shows what can be pulled)")
        return 0
    for m in models:
        kept = kept_gguf(m.name, root)
        size = m.size + (kept.stat().st_size if kept else 0)
        note = f" (GGUF kept: {kept.stat().st_size / 2**20:.0f} MiB)" if kept else ""
        print(f"{m.name}\t{size / 2**20:.0f} MiB{note}\t{m.quant}\t{m.source}")
    return 0


def kept_gguf(name: str, root: Path) -> Path | None:
    """The verified GGUF ``pull`` keeps for model ``name`` (``rm`` removes it), if any."""
    src = SOURCES.get(name)
    gguf = root / ".gguf" / src.filename if src else None
    return gguf if gguf is not None and gguf.is_file() else None


def cmd_show(args: Any) -> int:
    root = cache_root(args.cache_dir)
    folder = Path(args.name) if Path(args.name).is_dir() else model_folder(args.name, root)
    info = describe(folder)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for key, value in info.items():
        if value is not None:
            print(f"{key}: {value}")
    return 0


def cmd_rm(args: Any) -> int:
    root = cache_root(args.cache_dir)
    folder = model_folder(args.name, root)
    if not ((folder / REPORT_FILE).is_file() or (folder / OLD_REPORT).is_file()):
        raise GenaiRuntimeError(
            f"{folder} was not written by pull or import (it has no {REPORT_FILE}); rm leaves "
            "it alone: delete it yourself if you mean to"
        )
    shutil.rmtree(folder)
    removed = [str(folder)]
    gguf = kept_gguf(args.name, root)
    if gguf is not None and not args.keep_gguf:
        gguf.unlink()
        removed.append(str(gguf))
    print(f"removed {', '.join(removed)}")
    return 0
