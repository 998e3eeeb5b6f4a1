"""Tokenizer and TokenizerStream: text <-> token ids, call-compatible with onnxruntime-genai."""

from .core import Tokenizer, TokenizerStream, folder_problems

__all__ = ["Tokenizer", "TokenizerStream", "folder_problems"]
