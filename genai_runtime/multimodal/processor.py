"""``Model.create_multimodal_processor()``: prompt + audio (+ images) -> NamedTensors.

Audio: each clip is decoded, resampled and turned into log-mel features as the model folder's
``audio_processor_config.json`` says, stacked as ``audio_features`` [N, n_mel, frames]. Prompts
are tokenized into right-padded ``input_ids`` [N, T]. Image preprocessing is not implemented:
give ``pixel_values`` (and friends) to ``Generator.set_inputs`` directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..audio import FeatureConfig, decode_audio, log_mel, resample
from ..errors import GenerationError, ModelError, UnsupportedError
from .inputs import Audios, Images
from .tensors import NamedTensors

if TYPE_CHECKING:
    from ..model import Model

AUDIO_CONFIG = "audio_processor_config.json"
# Whisper's decoder prompt for an English transcript without timestamps.
TRANSCRIBE_PROMPT = "<|startoftranscript|><|notimestamps|>"


class MultiModalProcessor:
    def __init__(self, model: Model):
        from ..tokenizer import Tokenizer

        self.model = model
        self.tokenizer = Tokenizer(model)
        self._audio_config: FeatureConfig | None = None
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
            raise UnsupportedError(
                "image preprocessing is not implemented yet; compute pixel_values yourself and "
                "pass them with Generator.set_inputs / set_model_input"
            )
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

    def features(self, data: bytes, name: str = "<bytes>") -> np.ndarray:
        """Log-mel features [n_mel, frames] for one encoded audio clip."""
        config = self.audio_config
        pcm, rate = decode_audio(data, name)
        return log_mel(resample(pcm, rate, config.sample_rate, name=name), config)

    def _ids(self, prompts: list[str]) -> np.ndarray:
        rows = [self.tokenizer.encode(p) for p in prompts]
        width = max(len(r) for r in rows)
        pad = self.model.spec.tokens.pad
        ids = np.full((len(rows), width), 0 if pad is None else pad, np.int32)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
        return ids

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
