"""GGUF file / Hugging Face folder -> ONNX model folder import (``genai-runtime import`` /
``pull``), no torch needed.

Needs the ``gguf`` extra (the ``gguf`` reader, ``safetensors`` and ``onnx``); nothing here is
imported by the runtime itself.
"""

from .folder import CACHE_LAYOUTS, ImportResult, import_gguf, import_model

__all__ = ["CACHE_LAYOUTS", "ImportResult", "import_gguf", "import_model"]
