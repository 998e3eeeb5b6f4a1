"""Image preprocessing (og.Images + the multimodal processor) on the shared phi3-v model folder,
side by side with onnxruntime-genai's processor on images the test draws: prompt ids, image
sizes and token counts exactly; pixel values to fp16 rounding for PNG, closely for JPEG (the two
runtimes link different JPEG decoders)."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
from conftest import require_shared

import genai_runtime as og
from genai_runtime.errors import GenerationError, ModelError, UnsupportedError

Image = pytest.importorskip("PIL.Image")
ref_og = pytest.importorskip("onnxruntime_genai")

PROMPT = (
    "<|user|>\n<|image_1|>\n Can you convert the table to markdown format?\n<|end|>\n"
    "<|assistant|>\n"
)


def _drawing(width: int, height: int, seed: int) -> np.ndarray:
    """Smooth gradients plus a few hard-edged blocks: what resampling treats differently."""
    y, x = np.mgrid[0:height, 0:width]
    rng = np.random.default_rng(seed)
    img = np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)], -1)
    for _ in range(6):
        x0, y0 = rng.integers(0, width - 20), rng.integers(0, height - 20)
        img[y0 : y0 + 20, x0 : x0 + 30] = rng.integers(0, 256, 3)
    return img.astype(np.uint8)


def _encode(pixels: np.ndarray, fmt: str, mode: str | None = None) -> bytes:
    image = Image.fromarray(pixels)
    if mode:
        image = image.convert(mode)
    buf = io.BytesIO()
    image.save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


IMAGES = {
    "landscape.png": lambda: _encode(_drawing(487, 206, 0), "PNG"),
    "portrait.png": lambda: _encode(_drawing(311, 467, 1), "PNG"),
    "rgba.png": lambda: _encode(_drawing(640, 360, 2), "PNG", "RGBA"),
    "palette.png": lambda: _encode(_drawing(400, 300, 3), "PNG", "P"),
    "photo.jpg": lambda: _encode(_drawing(900, 600, 4), "JPEG"),
}


@pytest.fixture(scope="module")
def folder():
    return require_shared("fixtures", "onnxruntime-genai", "phi3-v")


@pytest.fixture(scope="module")
def processors(folder):
    return og.Model(str(folder)).create_multimodal_processor(), ref_og.Model(
        str(folder)
    ).create_multimodal_processor()


def _ours(tensors, name):
    return np.asarray(tensors[name].as_numpy())


@pytest.mark.parametrize("name", list(IMAGES))
def test_one_image_matches_the_reference_processor(processors, name) -> None:
    ours_p, ref_p = processors
    data = IMAGES[name]()
    ours = ours_p(PROMPT, images=og.Images.open_bytes(data))
    ref = ref_p(PROMPT, images=ref_og.Images.open_bytes(data))
    for key in ("input_ids", "image_sizes", "num_image_tokens"):
        np.testing.assert_array_equal(_ours(ours, key), ref[key].as_numpy(), err_msg=key)
    a = _ours(ours, "pixel_values")
    b = ref["pixel_values"].as_numpy()
    assert a.shape == b.shape == (1, 17, 3, 336, 336) and a.dtype == b.dtype == np.float16
    diff = np.abs(a.astype(np.float32) - b.astype(np.float32))
    if name.endswith(".png"):
        assert diff.max() <= 2e-3  # one fp16 step at these magnitudes
    else:
        assert diff.mean() <= 0.01 and np.quantile(diff, 0.99) <= 0.1


def test_two_images_and_open_from_a_file(processors, tmp_path) -> None:
    ours_p, ref_p = processors
    paths = []
    for name in ("landscape.png", "portrait.png"):
        paths.append(tmp_path / name)
        paths[-1].write_bytes(IMAGES[name]())
    prompt = "<|user|>\n<|image_1|>\n<|image_2|>\n What is shown in these two images?\n<|end|>\n"
    ours = ours_p(prompt, images=og.Images.open(*paths))
    ref = ref_p(prompt, images=ref_og.Images.open(*map(str, paths)))
    for key in ("input_ids", "image_sizes", "num_image_tokens"):
        np.testing.assert_array_equal(_ours(ours, key), ref[key].as_numpy(), err_msg=key)
    ids = _ours(ours, "input_ids")[0]
    counts = _ours(ours, "num_image_tokens")[:, 0]
    assert (ids == -1).sum() == counts[0] and (ids == -2).sum() == counts[1]
    assert _ours(ours, "image_sizes").tolist() == [[1008, 1680], [1344, 1008]]  # portrait: rows


def test_bad_images_and_prompts_are_clear_errors(processors, monkeypatch) -> None:
    ours_p, _ = processors
    with pytest.raises(GenerationError, match="cannot decode"):
        ours_p(PROMPT, images=og.Images.open_bytes(b"\x89PNG\r\n\x1a\n not really"))
    png = IMAGES["landscape.png"]()
    with pytest.raises(GenerationError, match="refers to 0 distinct images"):
        ours_p("no tag here", images=og.Images.open_bytes(png))
    with pytest.raises(GenerationError, match=r"<\|image_2\|> in the prompt, but only 1"):
        ours_p("<|image_2|>", images=og.Images.open_bytes(png))
    from genai_runtime.multimodal import images

    monkeypatch.setattr(images, "MAX_PIXELS", 10_000)  # a bomb is refused before decoding
    with pytest.raises(GenerationError, match="487x206 pixels exceed the limit of 10000"):
        ours_p(PROMPT, images=og.Images.open_bytes(png))


def test_processor_config_problems(folder, tmp_path) -> None:
    copy = tmp_path / "phi3-v"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "processor_config.json").read_text())
    config["processor"]["transforms"][2]["operation"]["type"] = "Resize"
    (copy / "processor_config.json").write_text(json.dumps(config))
    png = IMAGES["landscape.png"]()
    processor = og.Model(str(copy)).create_multimodal_processor()
    with pytest.raises(UnsupportedError, match=r"\['Resize'\].*Phi3ImageTransform"):
        processor(PROMPT, images=og.Images.open_bytes(png))
    (copy / "processor_config.json").unlink()
    with pytest.raises(ModelError, match="no image processor config"):
        processor(PROMPT, images=og.Images.open_bytes(png))
