"""``Images`` and ``Audios``: onnxruntime-genai's media loaders, not implemented yet.

They exist so code written for the reference fails with a clear ``UnsupportedError`` naming what
is missing, rather than an ``AttributeError``.
"""

from __future__ import annotations

from typing import Any, NoReturn

from .errors import UnsupportedError


def _unsupported(what: str) -> NoReturn:
    raise UnsupportedError(
        f"{what} is not implemented yet: genai_runtime has no image/audio processor; "
        "run text models, or feed precomputed features with Generator.set_model_input"
    )


class Images:
    @staticmethod
    def open(*paths: Any) -> Images:
        _unsupported("Images.open")

    @staticmethod
    def open_bytes(*data: Any) -> Images:
        _unsupported("Images.open_bytes")


class Audios:
    @staticmethod
    def open(*paths: Any) -> Audios:
        _unsupported("Audios.open")

    @staticmethod
    def open_bytes(*data: Any) -> Audios:
        _unsupported("Audios.open_bytes")
