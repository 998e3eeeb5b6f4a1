"""Audio input for speech models: decode a file, resample to the model's rate, log-mel features,
streamed a block at a time.

Decoding needs the ``audio`` extra (``pip install genai_runtime[audio]``: soundfile);
the features themselves are NumPy, driven by the model folder's ``audio_processor_config.json``.
"""

from .decode import AudioSource, PcmReader, decode_audio, load_audio
from .features import FeatureConfig, log_mel
from .resample import Resampler, resample
from .stream import ClipReader

__all__ = [
    "AudioSource",
    "ClipReader",
    "FeatureConfig",
    "PcmReader",
    "Resampler",
    "decode_audio",
    "load_audio",
    "log_mel",
    "resample",
]
