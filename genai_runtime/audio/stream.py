"""A clip read forward in windows at the model's rate: decode and resample a block at a time.

Holding one window (30 s at 16 kHz: 1.9 MB of float32) plus a decoder block and the resampler's
reach, memory stays the same for a 10-second clip and a 10-hour one.
"""

from __future__ import annotations

import numpy as np

from ..errors import GenerationError
from .decode import BLOCK_FRAMES, AudioSource, PcmReader
from .resample import Resampler


class ClipReader:
    """Forward-only windows ``[start, start + size)`` of one clip's PCM at ``sample_rate``."""

    def __init__(self, source: AudioSource, sample_rate: int, name: str = "<bytes>"):
        self.name = name
        self._reader = PcmReader(source, name)
        try:
            self._resampler = Resampler(self._reader.sample_rate, sample_rate, name)
        except GenerationError:
            self._reader.close()
            raise
        self._buffer = np.empty(0, np.float32)  # PCM from sample ``_origin`` on
        self._origin = 0
        self._skip = 0  # samples still to come that lie before ``_origin``
        self._ended = False

    @property
    def source_rate(self) -> int:
        return self._reader.sample_rate

    def window(self, start: int, size: int) -> tuple[np.ndarray, bool]:
        """(the samples ``[start, start + size)``, whether the clip ends inside that window).

        ``start`` never goes back before an earlier window's start: what lies before it is
        dropped. A window past the end is empty.
        """
        if start < self._origin:
            raise GenerationError(f"{self.name}: windows are read forward only")
        drop = start - self._origin
        self._skip += max(0, drop - self._buffer.size)  # a jump past what is buffered
        self._buffer = self._buffer[drop:]
        self._origin = start
        # One sample past the window tells whether the clip goes on.
        while not self._ended and self._buffer.size <= size:
            self._pull()
        return self._buffer[:size].copy(), self._ended and self._buffer.size <= size

    def _pull(self) -> None:
        block = self._reader.read(BLOCK_FRAMES)
        if block.size == 0:
            self._ended = True
            out = self._resampler.finish()
            self._reader.close()
        else:
            if not np.isfinite(block).all():
                raise GenerationError(f"{self.name}: the audio holds NaN or infinite samples")
            out = self._resampler.push(block)
        if self._skip:
            cut = min(self._skip, out.size)
            out, self._skip = out[cut:], self._skip - cut
        if out.size:
            self._buffer = np.concatenate([self._buffer, out])

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> ClipReader:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
