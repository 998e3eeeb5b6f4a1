"""GGUF -> ONNX model folder import (``genai-runtime import`` / ``pull``), no torch needed.

Needs the ``gguf`` extra (the ``gguf`` reader and ``onnx``); nothing here is imported by the
runtime itself.
"""

from .folder import CACHE_LAYOUTS, ImportResult, import_gguf

__all__ = ["CACHE_LAYOUTS", "ImportResult", "import_gguf"]
