"""Decode MP3 as the reference does: every frame, the encoder delay and padding kept.

The reference's decoder ignores the Xing / Info tag that encoders put in the first frame: it
decodes that frame as a frame of silence and keeps every decoded sample. The mpg123 decoder
inside libsndfile reads the tag instead ("gapless"): it skips the tag frame, drops the 529
samples of decoder delay, and drops the encoder delay and end padding the tag's LAME extension
records. That shifts the audio by 2257 samples for a 44.1 kHz LAME file and moves every log-mel
frame (mean 0.15, max 1.84 on a LibriSpeech MP3).

``gapless_edit`` finds the tag and the LAME extension's delay and padding; those three bytes are
read as zeros, so mpg123 drops only the tag frame and the decoder delay, and ``PcmReader`` puts
that many zeros back in front (measured with onnxruntime-genai 0.18: the features then agree to
4e-5). Hiding the whole tag instead would make mpg123 guess the length of a VBR file from its
first frame, and libsndfile stops reading there.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import BinaryIO

TAG_MARKERS = (b"Xing", b"Info")
DECODER_DELAY = 529  # samples mpg123 drops after a tag frame (Layer III's filterbank delay)
_HEAD = 256
# Layer III bitrates (kbit/s) by index: MPEG-1, then MPEG-2 / 2.5.
_BITRATES = (
    (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
)
_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


@dataclass(frozen=True)
class GaplessEdit:
    """Bytes to read as zeros, and the samples (per channel) to put back before the audio."""

    zero_at: int | None
    zero_len: int
    prefix: int


def _id3v2_size(head: bytes) -> int:
    """Bytes taken by an ID3v2 tag at the start of ``head`` (0 if there is none)."""
    if len(head) < 10 or head[:3] != b"ID3" or any(b & 0x80 for b in head[6:10]):
        return 0
    size = (head[6] << 21) | (head[7] << 14) | (head[8] << 7) | head[9]
    footer = 10 if head[5] & 0x10 else 0
    return 10 + size + footer


def _layer3_frame(header: bytes) -> tuple[int, int, int] | None:
    """(side-info bytes, frame bytes, samples per frame) of a Layer III header, else None."""
    if len(header) < 4 or header[0] != 0xFF or header[1] & 0xE0 != 0xE0:
        return None
    version = (header[1] >> 3) & 3  # 3: MPEG-1, 2: MPEG-2, 0: MPEG-2.5, 1: reserved
    layer = (header[1] >> 1) & 3  # 1: Layer III
    bitrate_index, rate_index = header[2] >> 4, (header[2] >> 2) & 3
    if version == 1 or layer != 1 or bitrate_index in (0, 15) or rate_index == 3:
        return None
    mpeg1 = version == 3
    mono = (header[3] >> 6) & 3 == 3
    bitrate = _BITRATES[0 if mpeg1 else 1][bitrate_index] * 1000
    rate = _RATES[version][rate_index]
    size = (144 if mpeg1 else 72) * bitrate // rate + ((header[2] >> 1) & 1)
    side = (17 if mono else 32) if mpeg1 else (9 if mono else 17)
    return side, size, 1152 if mpeg1 else 576


def gapless_edit(file: BinaryIO) -> GaplessEdit | None:
    """How to undo mpg123's gapless trimming for this file; None when it does not trim.

    Reads the ID3v2 header and the first frame's first bytes; the position is restored.
    """
    start = file.tell()
    try:
        skip = _id3v2_size(file.read(10))
        file.seek(start + skip)
        frame = file.read(_HEAD)
    finally:
        file.seek(start)
    layout = _layer3_frame(frame)
    if layout is None:
        return None
    side, size, samples = layout
    crc = 0 if frame[1] & 1 else 2  # a cleared protection bit: a 16-bit CRC follows the header
    marker = next(
        (at for at in (4 + side, 4 + side + crc) if frame[at : at + 4] in TAG_MARKERS), None
    )
    if marker is None:
        return None
    flags = int.from_bytes(frame[marker + 4 : marker + 8], "big")
    lame = marker + 8 + sum(n for bit, n in ((1, 4), (2, 4), (4, 100), (8, 4)) if flags & bit)
    delays = lame + 21  # 12 bits of encoder delay, 12 bits of end padding
    inside = delays + 3 <= min(size, len(frame))
    return GaplessEdit(
        zero_at=start + skip + delays if inside else None,
        zero_len=3 if inside else 0,
        prefix=samples + DECODER_DELAY,
    )


class ZeroedReader(io.RawIOBase):
    """A read-only view of a seekable binary file with ``length`` bytes at ``offset`` read as
    zeros."""

    def __init__(self, file: BinaryIO, offset: int, length: int):
        super().__init__()
        self._file = file
        self._offset = offset
        self._length = length

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def read(self, size: int = -1) -> bytes:
        pos = self._file.tell()
        data = self._file.read(size)
        lo = max(pos, self._offset)
        hi = min(pos + len(data), self._offset + self._length)
        if lo >= hi:
            return data
        patched = bytearray(data)
        patched[lo - pos : hi - pos] = bytes(hi - lo)
        return bytes(patched)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
