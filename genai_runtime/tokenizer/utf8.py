"""Bytes of vocabulary pieces and the reference's UTF-8 policy for decoded text.

onnxruntime-genai (through onnxruntime-extensions) concatenates per-token byte strings and then
applies its own UTF-8 rules; these helpers reproduce them, quirks included.
"""

from __future__ import annotations

SPM_SPACE = "\u2581"  # sentencepiece's "▁", stands for a space in pieces
REPLACEMENT = "\ufffd"
# Length of a UTF-8 sequence from the high nibble of its first byte (lenient, as the reference).
UTF8_LEN = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)


def _byte_level_table() -> dict[int, int]:
    """GPT-2 byte-level alphabet, inverted: code point -> byte, for the remapped bytes only.

    Code points <= 0xFF map to themselves, so only the 68 remapped ones (256..323) need a table.
    """
    table: dict[int, int] = {}
    nxt = 256
    for b in range(256):
        if b < 33 or 127 <= b < 161 or b == 173:
            table[nxt] = b
            nxt += 1
    return table


_BYTE_LEVEL = _byte_level_table()


def byte_level_bytes(piece: str) -> bytes:
    """Bytes of a byte-level BPE vocabulary piece (chars outside the alphabet pass as UTF-8)."""
    mapped = piece.translate(_BYTE_LEVEL)
    try:
        return mapped.encode("latin-1")
    except UnicodeEncodeError:
        out = bytearray()
        for ch in mapped:
            cp = ord(ch)
            out += bytes((cp,)) if cp <= 0xFF else ch.encode("utf-8")
        return bytes(out)


def _valid_prefix(data: bytes) -> tuple[int, bool]:
    """Length of the leading run that the reference's UTF-8 validator accepts, and whether it
    stopped early on bad UTF-8. Like the reference, the scan ends at the first NUL byte and
    treats U+FFFE / U+FFFF as invalid (Python's codec accepts those two)."""
    nul = data.find(0)
    scan = data if nul < 0 else data[:nul]
    try:
        text = scan.decode("utf-8")
        end, bad = len(scan), False
    except UnicodeDecodeError as exc:
        end, bad = exc.start, True
        text = scan[:end].decode("utf-8")
    if "\ufffe" in text or "\uffff" in text:
        cut = min(i for i in (text.find("\ufffe"), text.find("\uffff")) if i >= 0)
        return len(text[:cut].encode("utf-8")), True
    return end, bad


def finish_text(data: bytes) -> str:
    """Turn a decoded byte string into text the way the reference does.

    The reference truncates at the first invalid UTF-8 position and appends one U+FFFD (so a
    sequence cut inside a character decodes to "...\ufffd" and everything after is lost), and
    its C-string return value ends at the first NUL. One deliberate difference: an empty result
    stays "" (the reference returns "\ufffd" when every token was skipped, e.g. ``decode([eos])``).
    """
    if not data:
        return ""
    end, bad = _valid_prefix(data)
    if bad or end == 0:
        return data[:end].decode("utf-8") + REPLACEMENT
    return data[:end].decode("utf-8")


def is_one_valid_char(chunk: bytes) -> bool:
    """True when ``chunk`` is exactly one well-formed character the reference would emit."""
    if chunk[0] == 0:
        return False
    try:
        text = chunk.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return text not in ("\ufffe", "\uffff")
