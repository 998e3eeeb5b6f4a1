"""``Model.create_multimodal_processor()``: prompt + audio (+ images) -> NamedTensors.

Audio: each clip is decoded, resampled and turned into log-mel features as the model folder's
``audio_processor_config.json`` says, stacked as ``audio_features`` [N, n_mel, frames]. Prompts
are tokenized into right-padded ``input_ids`` [N, T].

Images: each is decoded and transformed as ``processor_config.json`` says (``images.py``), giving
``pixel_values`` [N, crops + 1, 3, 336, 336] in the vision graph's dtype, ``image_sizes`` [N, 2]
and ``num_image_tokens`` [N, 1]; each ``<|image_k|>`` in the prompt becomes that image's number
of tokens, all ``-k`` (the embedding graph puts image k's features there), as the reference does.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..errors import GenerationError, ModelError, UnsupportedError
from .inputs import Audios, Images
from .tensors import NamedTensors

if TYPE_CHECKING:
    from ..audio import AudioSource, FeatureConfig
    from ..runtime.plan import Plan
    from ..spec import PipelineSpec


class Model(Protocol):
    """What the processor reads of a loaded model (``genai_runtime.Model`` is one)."""

    model_dir: Path
    spec: PipelineSpec
    plan: Plan


log = logging.getLogger("genai_runtime.audio")

AUDIO_CONFIG = "audio_processor_config.json"
IMAGE_CONFIG = "processor_config.json"
IMAGE_TAG = re.compile(r"<\|image_(\d+)\|>")
# Whisper's decoder prompt for an English transcript without timestamps.
TRANSCRIBE_PROMPT = "<|startoftranscript|><|notimestamps|>"


class MultiModalProcessor:
    def __init__(self, model: Model):
        from ..tokenizer import Tokenizer

        self.model = model
        self.tokenizer = Tokenizer(model)
        self._audio_config: FeatureConfig | None = None
        self._image_transform: Callable[[np.ndarray], Any] | None = None
        self.audio_input = _audio_input_name(model)

    @property
    def audio_config(self) -> FeatureConfig:
        if self._audio_config is None:
            path = Path(self.model.model_dir) / AUDIO_CONFIG
            if not path.is_file():
                raise ModelError(
                    f"{path}: not found; the model folder has no audio processor config, so "
                    "audio cannot be turned into features"
                )
            from ..audio import FeatureConfig  # audio code loads only when audio is processed

            self._audio_config = FeatureConfig.from_file(path)
        return self._audio_config

    def __call__(
        self,
        prompt: str | Sequence[str] | None = None,
        *,
        images: Images | None = None,
        audios: Audios | None = None,
    ) -> NamedTensors:
        out = NamedTensors()
        if images is not None:
            if audios is not None:
                raise UnsupportedError("processor: images and audios together are not supported")
            return self._images(prompt, images)
        count = 1
        if audios is not None:
            if not isinstance(audios, Audios) or len(audios) == 0:
                raise GenerationError("processor: audios must be a non-empty og.Audios")
            out[self.audio_input] = np.stack(
                [self.features(data, name) for name, data in audios.items]
            )
            count = len(audios)
        if prompt is not None:
            prompts = [prompt] if isinstance(prompt, str) else list(prompt)
            if len(prompts) == 1 and count > 1:
                prompts = prompts * count
            if audios is not None and len(prompts) != count:
                raise GenerationError(
                    f"processor: {len(prompts)} prompts for {count} audio clips; give one "
                    "prompt, or one per clip"
                )
            out["input_ids"] = self._ids(prompts)
        return out

    def features(self, data: AudioSource, name: str = "<bytes>") -> np.ndarray:
        """Log-mel features [n_mel, frames] of one clip's first ``chunk_size`` seconds (what
        the reference's processor gives); only that much is decoded."""
        from ..audio import ClipReader, log_mel

        config = self.audio_config
        with ClipReader(data, config.sample_rate, name) as clip:
            pcm, ends = clip.window(0, config.chunk_size * config.sample_rate)
        if pcm.size == 0:
            raise GenerationError(f"{name}: the audio file holds no samples")
        if not ends:
            log.warning(
                "%s is longer than %d s: these features hold its first %d s, as the reference's "
                "processor does; Model.transcribe reads all of it",
                name,
                config.chunk_size,
                config.chunk_size,
            )
        return log_mel(pcm, config)

    def _ids(self, prompts: list[str]) -> np.ndarray:
        rows = [self.tokenizer.encode(p) for p in prompts]
        width = max(len(r) for r in rows)
        pad = self.model.spec.tokens.pad
        ids = np.full((len(rows), width), 0 if pad is None else pad, np.int32)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
        return ids

    @property
    def image_transform(self) -> Callable[[np.ndarray], Any]:
        """The per-image transform ``processor_config.json`` describes (read once)."""
        if self._image_transform is None:
            from .images import image_transform

            path = Path(self.model.model_dir) / IMAGE_CONFIG
            if not path.is_file():
                raise ModelError(
                    f"{path}: not found; the model folder has no image processor config"
                )
            try:
                config = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ModelError(f"{path}: cannot read it ({exc})") from None
            self._image_transform = image_transform(config, str(path))
        return self._image_transform

    def _images(self, prompt: Any, images: Images) -> NamedTensors:
        from .images import decode_image

        if not isinstance(images, Images) or len(images) == 0:
            raise GenerationError("processor: images must be a non-empty og.Images")
        if prompt is not None and not isinstance(prompt, str):
            raise UnsupportedError("processor: images take one prompt string (batch size 1)")
        transform = self.image_transform
        feats = [transform(decode_image(name, data)) for name, data in images.items]
        out = NamedTensors()
        out["pixel_values"] = np.stack([f.pixel_values for f in feats]).astype(
            self._input_dtype("pixel_values", np.float32)
        )
        out["image_sizes"] = np.array([f.image_size for f in feats], np.int64)
        counts = [f.num_tokens for f in feats]
        out["num_image_tokens"] = np.array(counts, np.int64)[:, None]
        out["input_ids"] = self._image_prompt(prompt or "", counts)
        return out

    def _image_prompt(self, prompt: str, counts: list[int]) -> np.ndarray:
        """Token ids of the text around each ``<|image_k|>`` tag, the tag replaced by
        ``counts[k-1]`` copies of ``-k``; every image must be referred to."""
        chunks = IMAGE_TAG.split(prompt)  # text, k, text, k, ..., text
        texts, tags = chunks[0::2], [int(k) for k in chunks[1::2]]
        if len(set(tags)) != len(counts):
            raise GenerationError(
                f"processor: the prompt refers to {len(set(tags))} distinct images "
                f"({', '.join(f'<|image_{k}|>' for k in sorted(set(tags))) or 'none'}) but "
                f"{len(counts)} were given"
            )
        ids: list[int] = []
        for i, text in enumerate(texts):
            ids.extend(int(t) for t in self.tokenizer.encode(text))
            if i < len(tags):
                k = tags[i]
                if not 1 <= k <= len(counts):
                    raise GenerationError(
                        f"processor: <|image_{k}|> in the prompt, but only {len(counts)} "
                        "images were given"
                    )
                ids.extend([-k] * counts[k - 1])
        return np.array([ids], np.int32)

    def _input_dtype(self, name: str, default: Any) -> Any:
        """The dtype a stage of the model declares for user input ``name``."""
        for stage in self.model.plan.stages:
            info = stage.io.inputs.get(name)
            if info is not None:
                return info.dtype
        return default

    def decode(self, ids: Any) -> str:
        return self.tokenizer.decode(ids)

    def batch_decode(self, rows: Any) -> list[str]:
        return [self.tokenizer.decode(r) for r in rows]

    def create_stream(self):
        return self.tokenizer.create_stream()


def _audio_input_name(model: Model) -> str:
    """The user input of an init stage that takes audio: the ``audio_features`` role's tensor."""
    for stage in model.plan.stages:
        name = stage.session.inputs.get("audio_features", "audio_features")
        if stage.step.when == "init" and name in stage.io.inputs:
            return name
    return "audio_features"
