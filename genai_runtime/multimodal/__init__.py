"""The reference's multimodal API: Tensor, NamedTensors, Images, Audios and the processor."""

from .inputs import Audios, Images
from .processor import MultiModalProcessor
from .streaming import StreamingProcessor
from .tensors import NamedTensors, Tensor

__all__ = [
    "Audios",
    "Images",
    "MultiModalProcessor",
    "NamedTensors",
    "StreamingProcessor",
    "Tensor",
]
