"""Constrained decoding: a JSON schema, regex or Lark grammar as a chain op, with llguidance.

llguidance (the reference's choice) was picked over xgrammar and outlines-core: it has no Python
dependencies (a 3 MB wheel; xgrammar requires torch and transformers), reads the model folder's
``tokenizer.json`` directly, compiles all three grammar kinds (outlines-core has no Lark and
compiles a schema to a regex DFA up front, ~0.2 s here) and computes a mask in ~25 us median on
SmolLM2's 49k vocabulary (``benchmarks/constrained_libraries.py``).

``Grammar`` keeps one matcher per batch row. After a token is committed, the mask for the next
step is computed on a worker thread (llguidance drops the GIL), overlapping the onnxruntime pass
that the generator runs next; the op waits for it only when it masks. A row whose grammar cannot
be extended any further is complete: the generator ends it as if EOS had been produced.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import GenerationError, UnsupportedError
from ..folder_paths import folder_file
from .processors import LOWEST

GUIDANCE_KINDS = ("json_schema", "regex", "lark_grammar")
# _BANNED_BITS[byte, i]: bit i (little-endian) of ``byte`` is clear, i.e. that token is banned.
_BANNED_BITS = ((np.arange(256)[:, None] >> np.arange(8)) & 1) == 0
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# JSON nesting of a schema (two levels per nested "properties"): jsonschema's own check
# recurses past Python's limit near 200; real schemas stay far below this.
MAX_SCHEMA_DEPTH = 100


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError:
        raise UnsupportedError(
            "constrained decoding needs llguidance: pip install 'genai-runtime[constrained]'"
        ) from None
    return llguidance


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str, stamp: tuple[int, int], vocab_size: int, eos: tuple[int, ...]) -> Any:
    # Building the token trie takes ~1 s for a 49k vocabulary: once per tokenizer file.
    llg = _llguidance()
    text = Path(path).read_text(encoding="utf-8")
    try:
        return llg.LLTokenizer(text, n_vocab=vocab_size, eos_token=list(eos))
    except Exception as error:  # llguidance raises ValueError / RuntimeError
        raise GenerationError(f"llguidance cannot use {path}: {error}") from None


def load_tokenizer(tokenizer_json: Path, vocab_size: int, eos_token_ids: Sequence[int]) -> Any:
    """llguidance's view of ``tokenizer.json`` (cached per file, size and modification time)."""
    if not tokenizer_json.is_file():
        raise GenerationError(f"constrained decoding needs {tokenizer_json}, which is missing")
    folder_file(tokenizer_json.parent, tokenizer_json.name)  # no symlink out of the folder
    st = tokenizer_json.stat()
    eos = tuple(int(e) for e in eos_token_ids if 0 <= e < vocab_size)
    return _tokenizer(str(tokenizer_json), (st.st_size, st.st_mtime_ns), vocab_size, eos)


def _deeper_than(doc: Any, limit: int) -> bool:
    """Whether lists/dicts in ``doc`` nest deeper than ``limit`` (walked without recursion)."""
    stack = [(doc, 1)] if isinstance(doc, dict | list) else []
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def grammar_source(kind: str, data: Any, *, where: str = "guidance") -> str:
    """llguidance's grammar for ``(kind, data)``; ``GenerationError`` naming ``where`` if bad.

    ``data`` is the schema (a JSON string or an already parsed object), the regex or the Lark
    text. Schemas are checked against the JSON Schema meta-schema first, for a precise message.
    """
    llg = _llguidance()
    if kind not in GUIDANCE_KINDS:
        expected = ", ".join(GUIDANCE_KINDS)
        raise GenerationError(f"{where}: unknown guidance type {kind!r} (expected: {expected})")
    if kind == "json_schema":
        schema = data
        deep = f"{where}: json_schema nests deeper than {MAX_SCHEMA_DEPTH} levels"
        if isinstance(data, (str, bytes)):
            try:
                schema = json.loads(data)
            except RecursionError:
                raise GenerationError(deep) from None
            except ValueError as error:
                raise GenerationError(f"{where}: json_schema is not valid JSON: {error}") from None
        if not isinstance(schema, (dict, bool)):
            raise GenerationError(
                f"{where}: json_schema must be a JSON object, got {type(schema).__name__}"
            )
        if _deeper_than(schema, MAX_SCHEMA_DEPTH):  # the validators recurse per level
            raise GenerationError(deep)
        import jsonschema

        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as error:
            at = "/".join(str(p) for p in error.absolute_path) or "(root)"
            raise GenerationError(
                f"{where}: json_schema is not a valid schema at {at}: {error.message}"
            ) from None
        try:
            # One canonical layout (", " and ": ", no other whitespace): small models otherwise
            # wander into endless legal whitespace. A schema's own "x-guidance" overrides it.
            return llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
        except ValueError as error:
            raise GenerationError(f"{where}: json_schema rejected: {error}") from None
    if not isinstance(data, str) or not data:
        raise GenerationError(f"{where}: {kind} must be a non-empty string, got {data!r}")
    if kind == "regex":
        return llg.LLMatcher.grammar_from_regex(data)
    return llg.LLMatcher.grammar_from_lark(data)


def check_grammar(grammar: str, tokenizer: Any, *, kind: str, where: str) -> None:
    """Compile once against the tokenizer; a grammar llguidance rejects is a GenerationError."""
    message = _llguidance().LLMatcher.validate_grammar(grammar, tokenizer)
    if message and not message.startswith("WARNING"):
        raise GenerationError(f"{where}: {kind} rejected by llguidance: {message}")


class Grammar:
    """The ``grammar`` op: mask every token the grammar cannot accept next, per batch row."""

    keeps_argmax = False
    active = True

    def __init__(
        self,
        kind: str,
        data: Any,
        *,
        tokenizer_json: Path,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        batch_size: int,
        where: str = "guidance",
    ):
        llg = _llguidance()
        self.kind = kind
        self.where = where
        source = grammar_source(kind, data, where=where)
        tokenizer = load_tokenizer(tokenizer_json, vocab_size, eos_token_ids)
        check_grammar(source, tokenizer, kind=kind, where=where)
        self._matchers = [llg.LLMatcher(tokenizer, source) for _ in range(batch_size)]
        for matcher in self._matchers:
            if matcher.is_error():
                raise GenerationError(f"{where}: {kind} rejected: {matcher.get_error()}")
        self.vocab_size = vocab_size
        self._words = (vocab_size + 31) // 32
        self._bits = np.full((batch_size, self._words), -1, dtype=np.int32)
        # Bytes of the bitmask expand to 8 "banned" flags through a 256-row table in one take()
        # into a reused buffer: one pass over the vocabulary, nothing allocated per token.
        self._banned = np.empty((self._words * 4, 8), dtype=bool)
        self.complete = np.zeros(batch_size, dtype=bool)
        self._consumed = 0
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self._schedule()

    # -- the op ------------------------------------------------------------------------------

    def __call__(self, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        self._wait()
        if logits.shape[1] != self.vocab_size:
            raise GenerationError(
                f"{self.where}: logits have {logits.shape[1]} columns, the grammar's "
                f"vocabulary {self.vocab_size}"
            )
        for b, row in enumerate(logits):
            if not self.complete[b]:
                self._mask_row(b, row)
        return logits

    def argmax(self, logits: np.ndarray) -> np.ndarray:
        """``argmax(self(tokens, logits))`` without masking rows whose argmax is allowed.

        The lowest id among the row's maxima is the masked row's argmax too when it is allowed.
        """
        self._wait()
        out = np.argmax(logits, axis=1).astype(np.int32)
        for b, t in enumerate(out.tolist()):
            if not self.complete[b] and not (int(self._bits[b, t >> 5]) >> (t & 31)) & 1:
                self._mask_row(b, logits[b])
                out[b] = np.argmax(logits[b])
        return out

    def _mask_row(self, b: int, row: np.ndarray) -> None:
        np.take(_BANNED_BITS, self._bits[b].view(np.uint8), axis=0, out=self._banned)
        np.copyto(row, LOWEST, where=self._banned.reshape(-1)[: self.vocab_size])

    def __repr__(self) -> str:
        return f"grammar({self.kind})"

    # -- state -------------------------------------------------------------------------------

    def commit(self, tokens: np.ndarray, ended: np.ndarray | None = None) -> np.ndarray:
        """Advance every unfinished row by its token; rows the grammar completed become True.

        ``ended`` rows (already finished by the generator, fed pad tokens) are left alone.
        """
        self._wait()
        if ended is not None:
            self.complete |= ended
        for b, matcher in enumerate(self._matchers):
            if self.complete[b]:
                continue
            if not matcher.consume_token(int(tokens[b])):
                raise GenerationError(
                    f"{self.where}: token {int(tokens[b])} in row {b} breaks the {self.kind}: "
                    f"{matcher.get_error()}"
                )
            if matcher.is_stopped():
                self.complete[b] = True
        self._consumed += 1
        self._schedule()
        return self.complete

    def restart(self, tokens: np.ndarray | None = None) -> None:
        """Back to the grammar's start, then replay ``tokens`` ``[B, n]`` (kept generated ones)."""
        self._wait()
        self.complete[:] = False
        for matcher in self._matchers:
            matcher.reset()
        self._consumed = 0
        if tokens is not None and tokens.shape[1]:
            for column in tokens.T:
                self.commit(column)
            return
        self._schedule()

    @property
    def consumed(self) -> int:
        return self._consumed

    def close(self) -> None:
        self._wait()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    # -- internals ---------------------------------------------------------------------------

    def _fill(self) -> None:
        for b, matcher in enumerate(self._matchers):
            if not self.complete[b]:
                row = self._bits[b]
                matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)

    def _schedule(self) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="genai-runtime-grammar")
        self._pending = self._pool.submit(self._fill)

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False)
