"""``StreamingProcessor``: the reference's chunk-by-chunk audio front end (raw PCM in, model
inputs out as each chunk fills).

onnxruntime-genai 0.18 builds one only for streaming speech models: Moonshine
(``streaming_enc_dec_asr``) and Nemotron (``nemotron_speech``) transducers. genai_runtime runs
neither, so like the reference with every other model, construction raises, naming the model.
"""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedError

STREAMING_MODEL_TYPES = ("streaming_enc_dec_asr", "nemotron_speech")


class StreamingProcessor:
    def __init__(self, model: Any):
        kind = getattr(model, "type", type(model).__name__)
        raise UnsupportedError(
            f"StreamingProcessor: model type {kind!r} has no streaming processor; the reference "
            f"builds one for streaming speech models ({', '.join(STREAMING_MODEL_TYPES)}), "
            "which genai_runtime does not run (Whisper models: og.MultiModalProcessor)"
        )
