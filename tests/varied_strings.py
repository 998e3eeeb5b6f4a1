"""Varied strings for tokenizer equality tests: unicode, code, whitespace runs, special tokens."""

from __future__ import annotations

import numpy as np


def varied_strings(n: int, seed: int = 0, extra: tuple[str, ...] = ()) -> list[str]:
    """``n`` strings glued from the pieces below (plus ``extra``) and random code points."""
    rng = np.random.default_rng(seed)
    pieces = [
        "hello",
        " world",
        "The",
        " quick",
        " brown",
        "fox",
        "don't",
        "I'm",
        "we'll",
        "123",
        " 4567",
        "3.14159",
        "1,000,000",
        "0x1F",
        "v2.0.1",
        "café",
        " naïve",
        "Ünïcödé",
        "straße",
        "日本語",
        "中文字符",
        "한국어",
        "Привет",
        "مرحبا",
        "שלום",
        "ελληνικά",
        "🙂",
        "👍🏽",
        "🇫🇷",
        "∑∫√",
        "€£¥",
        "—",
        "…",
        "def f(x):\n    return x ** 2\n",
        "if (a && b) { c++; }",
        '<div class="a">',
        "#include",
        "SELECT * FROM t;",
        "λx.x",
        "`code`",
        "**bold**",
        "http://example.com/a?b=c",
        " ",
        "  ",
        "    ",
        "\t",
        "\t\t",
        "\n",
        "\n\n",
        "\r\n",
        " \n ",
        "\u00a0",
        "\u200b",
        "\u3000",
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<reponame>",
        "<|im_start",
    ]
    pieces += list(extra)
    out = []
    for _ in range(n):
        k = int(rng.integers(1, 12))
        parts = [pieces[int(i)] for i in rng.integers(0, len(pieces), k)]
        if rng.random() < 0.3:  # random code points, surrogates excluded
            cps = rng.integers(0x20, 0x2FFF, int(rng.integers(1, 6)))
            parts.append("".join(chr(int(c)) for c in cps if not 0xD800 <= c < 0xE000))
        out.append("".join(parts))
    return out
