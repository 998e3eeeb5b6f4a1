"""The one exception family genai_runtime raises on purpose.

Everything derives from ``GenaiRuntimeError`` (itself a ``RuntimeError``, which is what
onnxruntime-genai's Python bindings raise, so existing ``except RuntimeError`` code keeps working).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class GenaiRuntimeError(RuntimeError):
    """Base class of every error genai_runtime raises deliberately."""


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a config: where (JSON path), what was found, what was expected."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(GenaiRuntimeError):
    """A config is malformed. Lists every problem found, each with its JSON path."""

    def __init__(self, problems: Iterable[ConfigProblem | str], source: str | None = None):
        self.problems: tuple[ConfigProblem, ...] = tuple(
            p if isinstance(p, ConfigProblem) else ConfigProblem("", p) for p in problems
        )
        self.source = source
        head = f"invalid config {source}" if source else "invalid config"
        if len(self.problems) == 1:
            text = f"{head}: {self.problems[0]}"
        else:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            text = f"{head} ({len(self.problems)} problems):\n{lines}"
        super().__init__(text)

    @classmethod
    def at(cls, path: str, message: str, source: str | None = None) -> ConfigError:
        """One problem at one JSON path: ``raise ConfigError.at("generation.top_p", "...")``."""
        return cls([ConfigProblem(path, message)], source)


class PathEscapeError(ConfigError):
    """A filename in a config points outside its model folder."""


class ModelError(GenaiRuntimeError):
    """A model folder does not match its config (missing/corrupt file, unknown tensor, bad dims)."""


class UnsupportedError(GenaiRuntimeError):
    """A valid request that this runtime does not implement (yet)."""


class GenerationError(GenaiRuntimeError):
    """Bad input to a generator: too-long prompt, out-of-range token, calls out of order."""


class TokenizerError(GenaiRuntimeError):
    """A tokenizer folder or chat template cannot be used."""


class DownloadError(GenaiRuntimeError):
    """A model download failed: no network, a package not found, or a hash mismatch."""


class TrustError(GenaiRuntimeError):
    """A config asks to run code, and the caller did not pass the explicit trust flag."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none): what an
    error that wraps a third-party one quotes."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
