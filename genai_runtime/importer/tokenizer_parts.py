"""tokenizer.json pieces both vocabulary writers (byte-level BPE, SentencePiece-style) share."""

from __future__ import annotations

from typing import Any

CONTROL, USER_DEFINED = 3, 4  # GGUF token types written as added tokens


def added_token(index: int, content: str, kind: int) -> dict[str, Any]:
    """One ``added_tokens`` entry: control tokens are special, user-defined ones are not."""
    return {
        "id": index,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": kind == CONTROL,
    }
