"""``ChatSession``: a multi-turn conversation over one Generator, reusing its KV cache.

Each turn renders the whole conversation with the chat template, keeps the longest prefix the
generator already holds (rewinding past anything that differs, e.g. a reply that re-tokenizes
differently) and appends only the rest, so the prompt pass covers just the new tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from .decoding.stopping import LOOP_WINDOW, StopPolicy, StopReason, StopRule
from .errors import GenerationError, UnsupportedError
from .generator import Generator, GeneratorParams
from .model import Model
from .tokenizer import Tokenizer

__all__ = ["ChatSession", "ConversationFull"]


class ConversationFull(GenerationError):
    """The conversation with the new message no longer fits ``max_length``."""

    def __init__(self, tokens: int, max_length: int, dropped: bool):
        self.tokens, self.max_length, self.dropped = tokens, max_length, dropped
        after = " after dropping every earlier turn" if dropped else ""
        super().__init__(
            f"the conversation no longer fits max_length {max_length}: it is {tokens} tokens "
            f"with the new message{after}; start over with reset() or raise max_length"
        )


class ChatSession:
    """A conversation with a chat model; ``send`` streams each reply.

    ``search_options`` are onnxruntime-genai search options (``max_length`` bounds the whole
    conversation); ``max_new_tokens`` optionally caps each reply; ``loop_span`` ends a reply
    whose last ``loop_span``+ tokens are one block repeated (0: never). With ``drop_oldest`` a
    message
    that would not leave room for a reply (``max_new_tokens``, else 64 tokens, at most a quarter
    of ``max_length``) first drops the oldest turns, keeping the system message.
    """

    def __init__(
        self,
        model: Model,
        tokenizer: Tokenizer | None = None,
        *,
        system: str | None = None,
        max_new_tokens: int | None = None,
        drop_oldest: bool = False,
        loop_span: int = 0,
        **search_options: Any,
    ) -> None:
        if max_new_tokens is not None and max_new_tokens < 1:
            raise GenerationError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.model = model
        self.tokenizer = tokenizer if tokenizer is not None else Tokenizer(model)
        self.system = system
        self.max_new_tokens = max_new_tokens
        self.drop_oldest = drop_oldest
        params = GeneratorParams(model)
        if search_options:
            params.set_search_options(**search_options)
        if params.search.num_beams > 1:
            raise UnsupportedError("a ChatSession streams one reply; beam search is not supported")
        self.generator = Generator(model, params)
        self.max_length: int = params.search.max_length
        self._stop = StopRule(model.spec.tokens.eos, policy=StopPolicy(loop_span=loop_span))
        self.messages: list[dict[str, str]] = self._initial_messages()
        self.last_prefill_tokens = 0  # tokens appended by the last turn's prompt pass
        self.last_reply_tokens: list[int] = []
        self.dropped_turns = 0  # oldest turns the last send dropped to make room
        # Why the last reply ended: "stop" (EOS), "loop" (it repeated itself), "length"
        # (max_new_tokens), "context" (max_length), or None while it streams / after it was
        # stopped or superseded.
        self.finish_reason: str | None = None
        self._turn = 0  # bumped by send/reset/abandon, so a stale reply iterator stops
        # While a reply streams: the messages before its turn and the tokens they share with it.
        self._before_turn: tuple[list[dict[str, str]], int] | None = None

    def _initial_messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}] if self.system else []

    def reset(self) -> None:
        """Forget the conversation (the system message stays) and empty the KV cache."""
        self._turn += 1
        self.generator.rewind_to(0)
        self.messages = self._initial_messages()
        self.last_prefill_tokens = 0
        self.last_reply_tokens = []
        self.finish_reason = None
        self._before_turn = None

    def set_system(self, system: str | None) -> None:
        """Replace the system message (None or "" removes it); the conversation stays, and the
        next turn recomputes the cache from where the text changed."""
        self.system = system or None
        turns = [m for m in self.messages if m["role"] != "system"]
        self.messages = self._initial_messages() + turns

    def abandon(self) -> bool:
        """Drop the turn whose reply is in progress (its user message and the reply so far); the
        KV cache rewinds to the end of the last whole turn. False when no reply was in progress.
        """
        if self._before_turn is None:
            return False
        self._turn += 1
        self.messages, kept = self._before_turn
        self._before_turn = None
        self.generator.rewind_to(kept)
        self.finish_reason = None
        return True

    def send(self, user_text: str) -> Iterator[str]:
        """Add a user turn, run its prompt pass now, and return an iterator over the reply text.

        The assistant message is in ``messages`` from the start and grows as the reply streams,
        so history always matches the KV cache, even if the caller stops early. A reply left
        unfinished when ``send`` is called again stops where it was.
        Raises GenerationError at once if the conversation no longer fits ``max_length``.
        """
        before = self.messages
        messages = [*before, {"role": "user", "content": user_text}]
        ids = self._prompt_ids(messages)
        dropped = 0
        if self.drop_oldest:
            room = min(self.max_new_tokens or 64, self.max_length // 4)
            while len(ids) + room > self.max_length and _drop_oldest_turn(messages):
                dropped += 1
                ids = self._prompt_ids(messages)
        if len(ids) >= self.max_length:
            raise ConversationFull(len(ids), self.max_length, bool(dropped))
        self._turn += 1
        kept = self._append(ids)
        self._before_turn = (before, kept)
        self.dropped_turns = dropped
        reply = {"role": "assistant", "content": ""}
        self.messages = [*messages, reply]
        self.last_reply_tokens = []
        self.finish_reason = None
        return self._reply(reply, self._turn)

    def _prompt_ids(self, messages: list[dict[str, str]]) -> np.ndarray:
        return np.asarray(self.tokenizer.encode_chat(messages), dtype=np.int64).reshape(-1)

    def _append(self, ids: np.ndarray) -> int:
        """Append what the generator does not hold yet; returns how many tokens it kept."""
        held = self.generator.get_sequence(0)
        common = _common_prefix(held, ids)
        if common == len(ids):  # nothing new (cannot happen with a new message, but be safe)
            common -= 1
        if common < len(held):
            self.generator.rewind_to(common)
        self.generator.append_tokens(ids[common:])
        self.last_prefill_tokens = len(ids) - common
        return common

    def _reply(self, reply: dict[str, str], turn: int) -> Iterator[str]:
        stream = self.tokenizer.create_stream()
        tokens = self.last_reply_tokens
        finish = None
        # Stop if a newer turn (or a reset) has taken over the generator.
        while turn == self._turn:
            if self.generator.is_done():  # the conversation fills max_length already
                finish = "context"
                break
            self.generator.generate_next_token()
            token = int(self.generator.get_next_tokens()[0])
            tokens.append(token)
            reason = self._stop.check(
                token, generated=len(tokens), length=self.generator.token_count(),
                budget=self.max_new_tokens, context=self.max_length,
                reply=np.asarray(tokens[-LOOP_WINDOW:]) if self._stop.policy.loop_span else None,
            )  # fmt: skip
            chunk = "" if reason is StopReason.EOS else stream.decode(token)
            if chunk:
                reply["content"] += chunk
                yield chunk
            if reason is not None:
                finish = _FINISH[reason]
                break
        if turn == self._turn:
            self.finish_reason = finish
            self._before_turn = None  # the turn is whole


_FINISH = {
    StopReason.EOS: "stop",
    StopReason.LOOP: "loop",
    StopReason.BUDGET: "length",
    StopReason.CONTEXT: "context",
}


def _drop_oldest_turn(messages: list[dict[str, str]]) -> bool:
    """Remove the oldest user message and the replies after it, never a system message or the
    newest message; False when there is nothing left to drop."""
    first = next(i for i, m in enumerate(messages) if m["role"] != "system")
    end = first + 1
    while end < len(messages) and messages[end]["role"] != "user":
        end += 1
    if end >= len(messages):  # only the new message is left
        return False
    del messages[first:end]
    return True


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n
