"""``ChatSession``: a multi-turn conversation over one Generator, reusing its KV cache.

Each turn renders the whole conversation with the chat template, keeps the longest prefix the
generator already holds (rewinding past anything that differs, e.g. a reply that re-tokenizes
differently) and appends only the rest, so the prompt pass covers just the new tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from .errors import GenerationError, UnsupportedError
from .generator import Generator, GeneratorParams
from .model import Model
from .tokenizer import Tokenizer

__all__ = ["ChatSession"]


class ChatSession:
    """A conversation with a chat model; ``send`` streams each reply.

    ``search_options`` are onnxruntime-genai search options (``max_length`` bounds the whole
    conversation); ``max_new_tokens`` optionally caps each reply.
    """

    def __init__(
        self,
        model: Model,
        tokenizer: Tokenizer | None = None,
        *,
        system: str | None = None,
        max_new_tokens: int | None = None,
        **search_options: Any,
    ) -> None:
        if max_new_tokens is not None and max_new_tokens < 1:
            raise GenerationError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.model = model
        self.tokenizer = tokenizer if tokenizer is not None else Tokenizer(model)
        self.system = system
        self.max_new_tokens = max_new_tokens
        params = GeneratorParams(model)
        if search_options:
            params.set_search_options(**search_options)
        if params.search.num_beams > 1:
            raise UnsupportedError("a ChatSession streams one reply; beam search is not supported")
        self.generator = Generator(model, params)
        self.max_length: int = params.search.max_length
        self._eos = {int(t) for t in model.spec.tokens.eos}
        self.messages: list[dict[str, str]] = self._initial_messages()
        self.last_prefill_tokens = 0  # tokens appended by the last turn's prompt pass
        self.last_reply_tokens: list[int] = []
        self._turn = 0  # bumped by send/reset, so a stale reply iterator stops

    def _initial_messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}] if self.system else []

    def reset(self) -> None:
        """Forget the conversation (the system message stays) and empty the KV cache."""
        self._turn += 1
        self.generator.rewind_to(0)
        self.messages = self._initial_messages()
        self.last_prefill_tokens = 0
        self.last_reply_tokens = []

    def send(self, user_text: str) -> Iterator[str]:
        """Add a user turn, run its prompt pass now, and return an iterator over the reply text.

        The assistant message is in ``messages`` from the start and grows as the reply streams,
        so history always matches the KV cache, even if the caller stops early. A reply left
        unfinished when ``send`` is called again stops where it was.
        Raises GenerationError at once if the conversation no longer fits ``max_length``.
        """
        messages = [*self.messages, {"role": "user", "content": user_text}]
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = np.asarray(self.tokenizer.encode(text), dtype=np.int64).reshape(-1)
        if len(ids) >= self.max_length:
            raise GenerationError(
                f"the conversation no longer fits max_length {self.max_length}: it is "
                f"{len(ids)} tokens with the new message; reset() the session or raise max_length"
            )
        self._turn += 1
        self._append(ids)
        reply = {"role": "assistant", "content": ""}
        self.messages = [*messages, reply]
        self.last_reply_tokens = []
        return self._reply(reply, self._turn)

    def _append(self, ids: np.ndarray) -> None:
        held = self.generator.get_sequence(0)
        common = _common_prefix(held, ids)
        if common == len(ids):  # nothing new (cannot happen with a new message, but be safe)
            common -= 1
        if common < len(held):
            self.generator.rewind_to(common)
        self.generator.append_tokens(ids[common:])
        self.last_prefill_tokens = len(ids) - common

    def _reply(self, reply: dict[str, str], turn: int) -> Iterator[str]:
        stream = self.tokenizer.create_stream()
        tokens = self.last_reply_tokens
        # Stop if a newer turn (or a reset) has taken over the generator.
        while turn == self._turn and not self.generator.is_done():
            if self.max_new_tokens is not None and len(tokens) >= self.max_new_tokens:
                break
            self.generator.generate_next_token()
            token = int(self.generator.get_next_tokens()[0])
            tokens.append(token)
            if token in self._eos:
                break
            chunk = stream.decode(token)
            if chunk:
                reply["content"] += chunk
                yield chunk


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n
