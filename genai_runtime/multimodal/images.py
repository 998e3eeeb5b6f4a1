"""Image preprocessing as onnxruntime-genai's processors do it: ``processor_config.json`` lists
transforms (onnxruntime-extensions names), run in order over each decoded image.

Supported chain: ``DecodeImage`` -> ``ConvertRGB`` -> ``Phi3ImageTransform`` (Phi-3 vision's
HD transform). Decoding uses Pillow (the ``vision`` extra); image bytes are untrusted, so the
pixel count is capped before decoding and a corrupt file is a ``GenerationError``.

Phi3ImageTransform, as the reference computes it: scale the image (bilinear) so its longer side
is a multiple of 336 and at most 16 tiles of 336x336 cover it, pad the shorter side with white
(centred) to a multiple of 336, normalise with the CLIP mean/std, then output a bicubic
336x336 "global" view followed by the tiles, zero-padded to 17 crops; ``image_sizes`` is the
padded (height, width) and ``num_img_tokens`` = (tiles + 1) * 144 + 1 + (rows + 1) * 12.
Pillow's resampling is the code onnxruntime-extensions embeds, so pixels agree closely.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import GenerationError, ModelError, UnsupportedError

TILE = 336
MAX_CROPS = 16  # the reference's transform always tiles up to 16, whatever num_crops says
TOKENS_PER_TILE = 144
CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], np.float32)
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], np.float32)
MAX_PIXELS = 64_000_000  # a decompression bomb is refused before its pixels are allocated


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise UnsupportedError(
            "image preprocessing needs Pillow: pip install 'genai-runtime[vision]'"
        ) from None
    return Image


def decode_image(name: str, data: bytes) -> np.ndarray:
    """The image as RGB uint8 [H, W, 3] (palette and alpha dropped, as the reference does)."""
    image_mod = _pillow()
    try:
        with image_mod.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > MAX_PIXELS:
                raise GenerationError(
                    f"image {name}: {width}x{height} pixels exceed the limit of {MAX_PIXELS}"
                )
            return np.asarray(image.convert("RGB"), dtype=np.uint8)
    except GenerationError:
        raise
    except Exception as exc:  # Pillow raises many types for corrupt or unknown data
        raise GenerationError(f"image {name}: cannot decode it ({exc})") from None


@dataclass(frozen=True)
class ImageFeatures:
    pixel_values: np.ndarray  # float32 [crops + 1, 3, 336, 336]
    image_size: tuple[int, int]  # padded (height, width)
    num_tokens: int


def phi3_hd_transform(rgb: np.ndarray, max_crops: int = MAX_CROPS) -> ImageFeatures:
    image_mod = _pillow()
    height, width = rgb.shape[:2]
    ratio = width / height if width >= height else height / width
    scale = 1
    while scale * math.ceil(scale / ratio) <= max_crops:
        scale += 1
    scale -= 1
    new_w = scale * TILE
    new_h = int(new_w / ratio)
    if width < height:
        new_w, new_h = new_h, new_w
    resized = image_mod.fromarray(rgb).resize((new_w, new_h), image_mod.Resampling.BILINEAR)
    pixels = np.asarray(resized, dtype=np.uint8)
    pixels = _pad_to_tiles(pixels, axis=1 if width < height else 0)
    h, w = pixels.shape[:2]
    hd = ((pixels.astype(np.float32) / 255.0 - CLIP_MEAN) / CLIP_STD).transpose(2, 0, 1)
    hd = np.ascontiguousarray(hd, dtype=np.float32)  # [3, h, w]
    out = np.zeros((max_crops + 1, 3, TILE, TILE), np.float32)
    for c in range(3):  # the global view: each channel resampled bicubic as a float image
        channel = image_mod.fromarray(hd[c], mode="F")
        out[0, c] = np.asarray(channel.resize((TILE, TILE), image_mod.Resampling.BICUBIC))
    rows, cols = h // TILE, w // TILE
    tiles = hd.reshape(3, rows, TILE, cols, TILE).transpose(1, 3, 0, 2, 4)
    out[1 : 1 + rows * cols] = tiles.reshape(rows * cols, 3, TILE, TILE)
    tokens = (rows * cols + 1) * TOKENS_PER_TILE + 1 + (rows + 1) * 12
    return ImageFeatures(out, (h, w), tokens)


def _pad_to_tiles(pixels: np.ndarray, axis: int) -> np.ndarray:
    """Pad ``axis`` (0: height, 1: width) with white up to a multiple of 336, centred."""
    size = pixels.shape[axis]
    target = math.ceil(size / TILE) * TILE
    if target == size:
        return pixels
    before = (target - size) // 2
    pad = [(0, 0)] * 3
    pad[axis] = (before, target - size - before)
    return np.pad(pixels, pad, constant_values=255)


# onnxruntime-extensions transform type -> what it does to one image (None: a step the decoder
# already performs). Anything else in a processor_config.json is refused with this list.
TRANSFORMS: dict[str, Callable[..., Any] | None] = {
    "DecodeImage": None,
    "ConvertRGB": None,
    "Phi3ImageTransform": phi3_hd_transform,
}


def image_transform(config: Any, source: str) -> Callable[[np.ndarray], ImageFeatures]:
    """The per-image transform a ``processor_config.json`` document describes."""
    try:
        steps = config["processor"]["transforms"]
        types = [step["operation"]["type"] for step in steps]
    except (KeyError, TypeError) as exc:
        raise ModelError(
            f"{source}: expected processor.transforms[].operation.type ({exc!r} missing)"
        ) from None
    unknown = [t for t in types if t not in TRANSFORMS]
    if unknown:
        raise UnsupportedError(
            f"{source}: image transforms {unknown} are not supported; supported: "
            f"{', '.join(TRANSFORMS)}"
        )
    final = [TRANSFORMS[t] for t in types if TRANSFORMS[t] is not None]
    if len(final) != 1:
        raise UnsupportedError(
            f"{source}: expected exactly one image transform after decoding, got {types}"
        )
    return final[0]
