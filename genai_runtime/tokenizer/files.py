"""Reading a model folder's tokenizer files: added tokens, decoder metadata, bounded JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..config.bounded import TOKENIZER_LIMITS, clip_text, load_json, read_bounded
from ..errors import TokenizerError


def token_text(value: Any) -> str | None:
    """A special-token entry of tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def added_tokens(spec: dict[str, Any], cfg: dict[str, Any]) -> tuple[dict[int, str], set[int]]:
    """Added tokens (id -> text) and the special ones: tokenizer.json first, then any extra
    ones tokenizer_config.json's added_tokens_decoder declares (as the reference merges them)."""
    entries = [
        (a.get("id"), a.get("content"), a.get("special")) for a in spec.get("added_tokens") or []
    ]
    for key, val in (cfg.get("added_tokens_decoder") or {}).items():
        if isinstance(val, Mapping) and str(key).isdigit():
            entries.append((int(key), val.get("content"), val.get("special")))
    added: dict[int, str] = {}
    special: set[int] = set()
    for idx, content, is_special in entries:
        if isinstance(idx, int) and isinstance(content, str) and idx not in added:
            added[idx] = content
            if is_special:
                special.add(idx)
    return added, special


def tokenizer_meta(hf: Any, path: Path) -> dict[str, Any]:
    """The parts of tokenizer.json that decoding needs, taken from the loaded tokenizer.

    Parsing the whole file again would rebuild its vocabulary and merges as Python objects:
    ~70 ms and ~25 MB of peak memory for a 49k-token BPE. Only the added tokens are read from
    the file, because `tokenizers` may renumber ones that collide with vocabulary ids.
    """
    model = hf.model
    vocab = hf.get_vocab(with_added_tokens=False)
    return {
        "model": {
            "type": type(model).__name__,
            "vocab": vocab,
            "end_of_word_suffix": getattr(model, "end_of_word_suffix", None),
        },
        "decoder": json.loads(hf.decoder.__getstate__()) if hf.decoder else None,
        "post_processor": (
            json.loads(hf.post_processor.__getstate__()) if hf.post_processor else None
        ),
        "added_tokens": declared_added_tokens(path),
    }


def declared_added_tokens(path: Path) -> list[Any]:
    """tokenizer.json's top-level ``added_tokens`` array, decoded without the rest of the file.

    Serialised tokenizers put it before the vocabulary (first, or among the first keys), so the
    first occurrence of the key is the top-level one; a window around it is grown until the
    array decodes.
    """
    raw = path.read_bytes()
    key = raw.find(b'"added_tokens"')
    if key < 0:
        return []
    start = raw.index(b"[", key)
    decoder = json.JSONDecoder()
    size = 1 << 16
    while True:
        window = raw[start : start + size].decode("utf-8", errors="replace")
        try:
            tokens = decoder.raw_decode(window)[0]
        except json.JSONDecodeError:
            if start + size >= len(raw):
                raise
            size *= 4
            continue
        return tokens if isinstance(tokens, list) else []


def read_json(path: Path, what: str) -> Any:
    try:
        return load_json(read_bounded(path, TOKENIZER_LIMITS.max_bytes), TOKENIZER_LIMITS)
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError, LimitError
        raise TokenizerError(f"cannot read {what} {path}: {clip_text(str(exc))}") from exc


def parse_bool_option(value: Any) -> bool:
    # The reference stringifies option values and treats only "false" / "0" as false.
    return str(value).lower() not in ("false", "0")
