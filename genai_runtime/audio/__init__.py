"""Audio input for speech models: decode a file, resample to the model's rate, log-mel features.

Decoding needs the ``audio`` extra (``pip install genai_runtime[audio]``: soundfile);
the features themselves are NumPy, driven by the model folder's ``audio_processor_config.json``.
"""

from .decode import decode_audio, load_audio
from .features import FeatureConfig, log_mel
from .resample import resample

__all__ = ["FeatureConfig", "decode_audio", "load_audio", "log_mel", "resample"]
