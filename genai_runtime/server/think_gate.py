"""One reply's thinking, token by token: a budget that closes it, and a grammar that waits for it.

``ThinkGate`` is a logits op (``(tokens, logits) -> logits``, in place) for one reply under a
chat template that writes ``<think>`` blocks. Each step it reads the reply's new tokens from the
history the token picker hands every op, decodes them, and follows where the reply is: before
any block (``start``), inside one (``reasoning``) or past it (``answer``).

- Inside the block nothing is masked until ``budget`` tokens of thinking have been generated;
  then the close tag's tokens are forced, one a step, and the reply goes on as the answer.
- A grammar (a ``response_format`` schema, a forced tool call) masks the answer only: it is fed
  the reply's tokens from the first one after the close tag, and once it is complete the reply
  is ended with EOS. The thinking is never constrained by it.
- A reply that may open a block itself (the prompt does not end inside one), under a grammar:
  its first token is either the open tag's first token (the block opens; the rest of the tag
  is forced) or a token the grammar allows (no thinking: the grammar applies from there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..decoding.processors import LOWEST
from ..tokenizer import Tokenizer
from .reasoning import CLOSE, OPEN, WHITESPACE, reply_starts


class ThinkGate:
    """The logits op of one reply (batch 1): see the module's description."""

    keeps_argmax = False
    active = True

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_text: str,
        prompt_length: int,
        *,
        budget: int | None,
        grammar: Any = None,
        eos: Sequence[int] = (),
    ):
        self.budget = budget
        self.grammar = grammar  # a batch-1 ``Grammar`` for the answer, or None
        self._open = [int(t) for t in tokenizer.encode(OPEN)]
        self._close = [int(t) for t in tokenizer.encode(CLOSE)]
        self._eos = [int(t) for t in eos]
        self._stream = tokenizer.create_stream()
        self._seen = prompt_length  # history columns already read
        self.mode = reply_starts(prompt_text)  # start | reasoning | answer
        self.thought = 0  # tokens the model thought inside the block
        self._text = ""  # start: the reply so far; reasoning: its tail, for the close tag
        self._forced: list[int] = []  # tokens still to force, first next
        self._opener_allowed = False  # the grammar would take the open tag's first token too
        self._decided = False  # start, under a grammar: the first token has chosen

    def __call__(self, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        for token in tokens[0, self._seen :].tolist():
            self._observe(int(token))
        self._seen = tokens.shape[1]
        if self._forced:
            return _force(logits, self._forced[0])
        if self.mode == "reasoning":
            if self.budget is not None and self.thought >= self.budget:
                self._forced = list(self._close)
                return _force(logits, self._forced[0])
            return logits
        if self.grammar is None:
            return logits
        if self.mode == "start":  # the first token: open a block, or begin the answer
            opener = self._open[0]
            score = float(logits[0, opener])
            self.grammar(tokens, logits)
            self._opener_allowed = bool(logits[0, opener] > LOWEST)
            logits[0, opener] = score
            return logits
        if self.grammar.complete[0]:
            return _force(logits, self._eos[0]) if self._eos else logits
        return self.grammar(tokens, logits)

    def _observe(self, token: int) -> None:
        """Follow the reply past one more of its tokens."""
        forced = bool(self._forced) and token == self._forced[0]
        self._forced = self._forced[1:] if forced else []
        piece = self._stream.decode(token)
        if self.mode == "start":
            if self.grammar is not None and not self._decided:
                self._decided = True
                opens = token == self._open[0]
                if not opens or (len(self._open) > 1 and self._opener_allowed):
                    self.mode = "answer"
                    self.grammar.commit(np.array([token], np.int32))
                    return
                self._forced = self._open[1:]
            self._text += piece
            stripped = self._text.lstrip(WHITESPACE)
            if stripped.startswith(OPEN) or (len(self._open) == 1 and token == self._open[0]):
                self.mode, self._text = "reasoning", stripped[len(OPEN) :]
            elif stripped and not OPEN.startswith(stripped[: len(OPEN)]):
                self.mode = "answer"
            return
        if self.mode == "reasoning":
            self._text = (self._text + piece)[-(len(CLOSE) + len(piece)) :]
            if CLOSE in self._text or (len(self._close) == 1 and token == self._close[0]):
                self.mode, self._forced = "answer", []
            elif not forced:  # the close tag, forced, is not thinking
                self.thought += 1
            return
        if self.grammar is not None and not self.grammar.complete[0]:
            self.grammar.commit(np.array([token], np.int32))

    def __repr__(self) -> str:
        inner = "" if self.grammar is None else f", then {self.grammar!r}"
        return f"think_gate(budget={self.budget}{inner})"


def _force(logits: np.ndarray, token: int) -> np.ndarray:
    """Every token but ``token`` masked."""
    logits[:] = LOWEST
    logits[0, token] = 0.0
    return logits
