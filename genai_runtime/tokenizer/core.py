"""Tokenizer and TokenizerStream: text <-> token ids, call-compatible with onnxruntime-genai.

Encoding runs the `tokenizers` library on the model folder's ``tokenizer.json``. Decoding is
done here, token by token, because onnxruntime-genai (through onnxruntime-extensions) does not
use the Hugging Face decoder pipeline: it concatenates per-token byte strings and then applies
its own UTF-8 policy. Reproducing that keeps ``decode`` and the stream identical to the
reference, quirks included (see ``utf8.finish_text`` and ``TokenizerStream.decode``).

Chat templates are rendered by ``templates.ChatTemplates``.
"""

from __future__ import annotations

import bisect
import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..config.bounded import LimitError, clip_text
from ..errors import GenaiRuntimeError, TokenizerError
from ..folder_paths import folder_file
from .files import added_tokens, parse_bool_option, read_json, token_text, tokenizer_meta
from .templates import ChatTemplates, json_arg, locate_strings, tool_definitions
from .utf8 import SPM_SPACE, UTF8_LEN, byte_level_bytes, finish_text, is_one_valid_char

__all__ = ["Tokenizer", "TokenizerStream"]

_MAX_TOKENIZER_JSON_BYTES = 1 << 30  # a sanity cap: the largest real ones are ~40 MB
_OPTION_KEYS = frozenset({"add_special_tokens", "skip_special_tokens"})
# Tokenizer families that get a BOS by convention when nothing else says so (as the reference).
_BOS_BY_CLASS = frozenset({"Llama", "Phi3", "InternLM2", "Gemma", "CodeLlama", "Mistral"})
_PLAIN_LOCK = threading.Lock()  # builds the plain-text twin of a tokenizer once


# ---------------------------------------------------------------------------------------------


class Tokenizer:
    """Text <-> token ids for one model folder (``tokenizer.json`` + ``tokenizer_config.json``).

    ``Tokenizer(model)`` takes any object with ``model_dir`` and ``tokens`` (``bos``, ``eos``,
    ``pad``) attributes, or a folder path; ``Tokenizer.from_dir`` is the explicit form. Token
    ids from the model config win over the tokenizer_config.json special tokens.
    """

    def __init__(self, model: Any) -> None:
        if isinstance(model, (str, Path)):
            self._setup(Path(model), None, (), None, {})
            return
        try:
            model_dir = Path(model.model_dir)
        except (AttributeError, TypeError) as exc:
            raise TokenizerError(
                f"Tokenizer() needs a model (with model_dir and tokens) or a folder path, "
                f"got {type(model).__name__}"
            ) from exc
        tokens = getattr(model, "tokens", None)
        bos = getattr(tokens, "bos", None)
        eos = tuple(getattr(tokens, "eos", ()) or ())
        pad = getattr(tokens, "pad", None)
        extra = dict(getattr(tokens, "extra", None) or {})
        root = getattr(getattr(model, "spec", None), "root", None)  # Model(..., root=) widens it
        self._setup(model_dir, bos, eos, pad, extra, root)

    @classmethod
    def from_dir(
        cls,
        model_dir: str | Path,
        *,
        bos_token_id: int | None = None,
        eos_token_ids: Iterable[int] = (),
        pad_token_id: int | None = None,
        root: str | Path | None = None,
    ) -> Tokenizer:
        """Load the tokenizer of ``model_dir``; explicit ids override tokenizer_config.json.
        ``root`` widens where the folder's files may resolve (default: the folder itself)."""
        tok = cls.__new__(cls)
        root = Path(root) if root is not None else None
        tok._setup(Path(model_dir), bos_token_id, tuple(eos_token_ids), pad_token_id, {}, root)
        return tok

    # -- loading ------------------------------------------------------------------------------

    def _setup(
        self,
        model_dir: Path,
        bos: int | None,
        eos: tuple[int, ...],
        pad: int | None,
        extra: dict[str, int],
        root: Path | None = None,
    ) -> None:
        self.model_dir = model_dir
        self._root = root
        tok_path = model_dir / "tokenizer.json"
        if not tok_path.is_file():
            raise TokenizerError(f"no tokenizer.json in {model_dir}")
        folder_file(model_dir, tok_path.name, root)  # a symlink must not read files elsewhere
        try:
            from tokenizers import Tokenizer as HfTokenizer  # imported when first needed

            size = tok_path.stat().st_size
            if size > _MAX_TOKENIZER_JSON_BYTES:
                raise LimitError(
                    f"file is {size} bytes, over the limit of {_MAX_TOKENIZER_JSON_BYTES}"
                )
            self._hf = HfTokenizer.from_file(str(tok_path))
            self._plain_hf: Any = None  # a twin reading special-token text as plain text
            self._special_texts: tuple[str, ...] | None = None  # their spellings, once asked
            decoder = self._hf.get_added_tokens_decoder()
            # `tokenizers` ids of the special added tokens (the control tokens)
            self._hf_specials = frozenset(i for i, t in decoder.items() if t.special)
            spec = tokenizer_meta(self._hf, tok_path)
        except Exception as exc:  # tokenizers raises plain Exception on bad files
            raise TokenizerError(f"cannot load {tok_path}: {clip_text(str(exc))}") from exc
        cfg_path = model_dir / "tokenizer_config.json"
        if cfg_path.is_file():
            cfg = read_json(folder_file(model_dir, cfg_path.name, root), "tokenizer config")
        else:
            cfg = {}
        if not isinstance(cfg, dict):
            raise TokenizerError(f"{cfg_path} must hold a JSON object")
        try:
            self._setup_from(model_dir, spec, cfg, bos, eos, pad, extra)
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
            # A value of the wrong JSON type somewhere in tokenizer_config.json / tokenizer.json.
            raise TokenizerError(
                f"malformed tokenizer files in {model_dir}: {type(exc).__name__}: "
                f"{clip_text(str(exc))}"
            ) from exc

    def _setup_from(
        self,
        model_dir: Path,
        spec: dict[str, Any],
        cfg: dict[str, Any],
        bos: int | None,
        eos: tuple[int, ...],
        pad: int | None,
        extra: dict[str, int],
    ) -> None:
        self._clip = self._class_name(cfg) == "CLIP"
        self._options = {"add_special_tokens": False, "skip_special_tokens": True}

        model = spec.get("model") or {}
        vocab = model.get("vocab") or {}
        if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
            vocab = {entry[0]: i for i, entry in enumerate(vocab)}
        self._vocab: dict[str, int] = vocab
        size = max(vocab.values(), default=-1) + 1
        self._pieces: list[str | None] = [None] * size
        for piece, idx in vocab.items():
            self._pieces[idx] = piece
        self._piece_bytes: dict[int, bytes] = {}
        self._eow_suffix = model.get("end_of_word_suffix") or ""

        self._added, self._special_ids = added_tokens(spec, cfg)
        self._added_ids: dict[str, int] = {}
        for idx, content in self._added.items():
            self._added_ids.setdefault(content, idx)
        # `tokenizers` renumbers added tokens that collide with vocabulary ids; map them back.
        self._remap: dict[int, int] = {}
        for content, idx in self._added_ids.items():
            hf_id = self._hf.token_to_id(content)
            if hf_id is not None and hf_id != idx:
                self._remap[hf_id] = idx

        self._spm, self._dummy_prefix = self._detect_spm(spec, model)
        # gpt-oss style "channel" models keep special tokens in decoded text (as the reference).
        self._never_skip = self._added.get(200005) == "<|channel|>"

        names = ("bos_token", "eos_token", "pad_token", "unk_token")
        self._special_text = {n: t for n in names if (t := token_text(cfg.get(n))) is not None}
        self._unk_text = self._special_text.get("unk_token", "")
        self._cleanup_spaces = bool(cfg.get("clean_up_tokenization_spaces", False))
        self._cfg_eos_id = self._lookup(self._special_text.get("eos_token"))
        # The stream's "no trailing space after EOS" check uses the vocabulary id only.
        self._stream_eos_id = self._vocab.get(self._special_text.get("eos_token", ""))
        self._add_bos, self._add_eos = self._special_token_rule(spec, cfg)

        cfg_bos = self._lookup(self._special_text.get("bos_token"))
        cfg_pad = self._lookup(self._special_text.get("pad_token"))
        self._bos = bos if bos is not None else cfg_bos
        self._eos = tuple(int(e) for e in eos) or (
            (self._cfg_eos_id,) if self._cfg_eos_id is not None else ()
        )
        if pad is None:
            pad = cfg_pad if cfg_pad is not None else (self._eos[0] if self._eos else 0)
        self._pad = int(pad)
        self._extra = extra
        self.templates = ChatTemplates.load(model_dir, cfg, self._root)

    @staticmethod
    def _detect_spm(spec: dict[str, Any], model: dict[str, Any]) -> tuple[bool, bool]:
        """Sentencepiece-style decoding (▁ for spaces, <0xNN> byte pieces)? And is a leading
        space stripped after a special token (the decoder's Strip / add_prefix_space)?"""
        decoder = spec.get("decoder") or {}
        steps = decoder.get("decoders") if decoder.get("type") == "Sequence" else [decoder]
        spm = model.get("type") == "Unigram"
        dummy = False
        for step in steps or []:
            kind = step.get("type")
            if kind == "Replace" and (step.get("pattern") or {}).get("String") == SPM_SPACE:
                spm = True
            elif kind == "Metaspace" and step.get("replacement") == SPM_SPACE:
                spm = True
                dummy = dummy or bool(step.get("add_prefix_space"))
                dummy = dummy or step.get("prepend_scheme") in ("always", "first")
            elif kind == "Strip" and step.get("content") == " ":
                dummy = True
        return spm, dummy

    def _special_token_rule(self, spec: dict[str, Any], cfg: dict[str, Any]) -> tuple[bool, bool]:
        """Whether encode adds BOS / EOS once ``add_special_tokens`` is switched on.

        The reference's rule: an explicit ``add_bos_token`` / ``add_eos_token`` in
        tokenizer_config.json, else whether the tokenizer.json post_processor mentions the token,
        else BOS for Llama-like tokenizer classes. (By default encode adds neither.)
        """
        bos_text = self._special_text.get("bos_token", "")
        eos_text = self._special_text.get("eos_token", "")
        post = spec.get("post_processor")
        post_text = json.dumps(post, ensure_ascii=False) if post is not None else ""
        add_bos, add_eos = cfg.get("add_bos_token"), cfg.get("add_eos_token")
        bos_explicit, eos_explicit = isinstance(add_bos, bool), isinstance(add_eos, bool)
        add_bos, add_eos = add_bos is True, add_eos is True
        if not bos_explicit and bos_text:
            if post_text and bos_text in post_text:
                add_bos = True
            else:
                add_bos = self._class_name(cfg) in _BOS_BY_CLASS
            if not eos_explicit and post_text and eos_text and eos_text in post_text:
                add_eos = True
        elif not add_bos and bos_text and post_text:
            add_bos = bos_text in post_text
            add_eos = add_eos or bool(eos_text and eos_text in post_text)
        return add_bos, add_eos

    @staticmethod
    def _class_name(cfg: dict[str, Any]) -> str:
        # "LlamaTokenizerFast" -> "Llama", "TokenizersBackend" -> "", as the reference does
        name = str(cfg.get("tokenizer_class") or "")
        cut = name.find("Tokenizer")
        if cut < 0:
            cut = name.find("Backend")
        return name[:cut] if cut >= 0 else name

    def _lookup(self, text: str | None) -> int | None:
        if not text:
            return None
        idx = self._added_ids.get(text)
        return idx if idx is not None else self._vocab.get(text)

    # -- properties ---------------------------------------------------------------------------

    @property
    def bos_token_id(self) -> int:
        """BOS id (config first, then tokenizer_config.json); -1 when neither defines one."""
        return -1 if self._bos is None else int(self._bos)

    @property
    def eos_token_ids(self) -> np.ndarray:
        """End-of-sequence ids as an int32 array (the reference's type)."""
        return np.array(self._eos, dtype=np.int32)

    @property
    def pad_token_id(self) -> int:
        return self._pad

    def _extra_id(self, name: str) -> int:
        for key in (name, f"{name}_token_id", f"{name}_token"):
            if isinstance(self._extra.get(key), int):
                return int(self._extra[key])
        raise TokenizerError(f"{name}_token_id is not defined for this model")

    @property
    def bot_token_id(self) -> int:
        """Begin-of-tool-call id, when the model config defines it."""
        return self._extra_id("bot")

    @property
    def eot_token_id(self) -> int:
        """End-of-tool-call id, when the model config defines it."""
        return self._extra_id("eot")

    @property
    def bor_token_id(self) -> int:
        """Begin-of-reasoning id, when the model config defines it."""
        return self._extra_id("bor")

    @property
    def eor_token_id(self) -> int:
        """End-of-reasoning id, when the model config defines it."""
        return self._extra_id("eor")

    def update_options(self, **options: Any) -> None:
        """Set ``add_special_tokens`` (default false) / ``skip_special_tokens`` (default true)."""
        if not options:
            raise TokenizerError("No options provided.")
        for key, value in options.items():
            if key not in _OPTION_KEYS:
                raise TokenizerError(f"Invalid tokenizer option key: {key}")
            if str(value) == "":
                raise TokenizerError(f"Option value cannot be empty for key: {key}")
        for key, value in options.items():
            self._options[key] = parse_bool_option(value)

    # -- encoding -----------------------------------------------------------------------------

    def _encode_ids(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects a str, got {type(text).__name__}")
        text = text.split("\x00", 1)[0]  # the reference passes a C string
        try:
            ids = self._hf.encode(text, add_special_tokens=False).ids
        except Exception as exc:  # e.g. an unknown character and no usable unk token
            raise TokenizerError(f"cannot encode {text[:40]!r}: {exc}") from exc
        return self._finish_ids(ids)

    def _finish_ids(self, ids: list[int]) -> list[int]:
        """`tokenizers` ids -> ours (renumbered added tokens), with BOS/EOS if the options say."""
        if self._remap:
            ids = [self._remap.get(i, i) for i in ids]
        if self._options["add_special_tokens"]:
            bos = self._lookup(self._special_text.get("bos_token"))
            if self._add_bos and bos is not None:
                ids.insert(0, bos)
            if self._add_eos and self._cfg_eos_id is not None:
                ids.append(self._cfg_eos_id)
        return ids

    def _hf_encoding(self, text: str, plain: bool = False) -> Any:
        """The `tokenizers` encoding of all of ``text`` (``plain``: special-token text is plain
        text). ``encode_batch`` because it releases the GIL while it works (``encode`` does not):
        a server's event loop keeps answering meanwhile. The text is not quoted in errors."""
        hf = self._plain_twin() if plain else self._hf
        try:
            return hf.encode_batch([text], add_special_tokens=False)[0]
        except Exception as exc:  # e.g. a lone surrogate, or no usable unk token
            raise TokenizerError(
                f"cannot encode a text of {len(text)} characters: {clip_text(str(exc))}"
            ) from exc

    def _plain_twin(self) -> Any:
        if self._plain_hf is None:
            with _PLAIN_LOCK:
                if self._plain_hf is None:
                    twin = type(self._hf).from_str(self._hf.to_str())
                    twin.encode_special_tokens = True
                    self._plain_hf = twin
        return self._plain_hf

    def encode_with_literals(
        self, text: str, literal: Sequence[tuple[int, int]] = ()
    ) -> np.ndarray:
        """Ids of all of ``text`` (int32, 1-D): unlike ``encode``, a NUL is data, not the end.

        Special-token text inside the ``literal`` character spans ``[start, end)`` (sorted,
        disjoint; e.g. where message contents landed in a chat prompt) is encoded as plain text,
        so it never becomes a control token; elsewhere it is one id, as in ``encode``. Text with
        no special token inside a span is encoded whole, exactly as ``encode`` would.
        """
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects a str, got {type(text).__name__}")
        encoding = self._hf_encoding(text)
        ids = encoding.ids
        spans: list[tuple[int, int]] = []
        if literal and self._hf_specials:  # where each special token came from (characters)
            specials = np.fromiter(self._hf_specials, np.int64, len(self._hf_specials))
            at = np.flatnonzero(np.isin(np.asarray(ids, np.int64), specials))
            spans = forged_spans([encoding.token_to_chars(int(k)) for k in at], literal)
        if spans:
            ids, pos = [], 0
            for start, end in spans:
                ids += self._hf_encoding(text[pos:start]).ids
                ids += self._hf_encoding(text[start:end], plain=True).ids
                pos = end
            ids += self._hf_encoding(text[pos:]).ids
        return np.asarray(self._finish_ids(list(ids)), dtype=np.int32)

    def encode_chat(
        self,
        messages: str | Sequence[Mapping[str, Any]],
        *,
        template_str: str | None = None,
        tools: str | Sequence[Any] | None = None,
        add_generation_prompt: bool = True,
        literal_content: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> np.ndarray:
        """Ids of the chat prompt: ``apply_chat_template`` encoded whole (a NUL is data), with
        ``encode_prompt``'s BOS rule. Every caller that turns messages into a prompt (``run``,
        ``chat``, ``Model.generate``, the server, Ray Data) uses this one method.

        With ``literal_content`` (the default) special-token text typed in a message's string
        ``content`` (``<|im_end|>``), or anywhere in its tool calls or in ``tools``, is encoded
        as plain text, so request data cannot forge a turn; the template's own special tokens
        stay control tokens. A template that reshapes such text so that it cannot be found
        again in the prompt gets a ``TokenizerError`` naming where the text was.
        """
        parsed = json_arg(messages, "messages")
        tool_list = tool_definitions(tools)

        def render(msgs: Any, tool_defs: Any) -> str:
            return self.apply_chat_template(
                msgs, template_str=template_str, tools=tool_defs,
                add_generation_prompt=add_generation_prompt, template_kwargs=template_kwargs,
            )  # fmt: skip

        if not literal_content:
            return self._with_bos(self.encode_with_literals(render(parsed, tool_list)))
        text, spans, risky = locate_strings(render, parsed, tool_list, self._holds_special)
        if spans is None:  # cannot tell where request text went: refuse only what is dangerous
            if risky:
                raise TokenizerError(
                    f"{risky[0]} holds special-token text, and the chat template reshapes "
                    "request text, so it cannot be kept as plain text"
                )
            spans = []
        return self._with_bos(self.encode_with_literals(text, spans))

    def _holds_special(self, text: str) -> bool:
        """Whether encoding ``text`` gives a control token (the special added tokens)."""
        if self._special_texts is None:
            texts = (self._hf.id_to_token(i) for i in self._hf_specials)
            self._special_texts = tuple(t for t in texts if t)
        if not any(t in text for t in self._special_texts):
            return False  # the common case, without running the tokenizer
        return bool(self._hf_specials.intersection(self._hf_encoding(text).ids))

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` (int32, 1-D). Special-token text such as "<|im_start|>" becomes
        its id; no BOS/EOS is added unless ``update_options(add_special_tokens=True)``."""
        return np.asarray(self._encode_ids(text), dtype=np.int32)

    def encode_prompt(self, text: str) -> np.ndarray:
        """Ids to generate from: ``encode(text)`` with BOS first where the tokenizer config says
        the model wants one (the rule ``add_special_tokens`` follows: ``add_bos_token``, else the
        post-processor, else a Llama-like class), unless the text already starts with it (a chat
        template that writes ``{{ bos_token }}``). Not in the reference's API, whose ``encode``
        adds no BOS: ``run``, ``chat`` and ``ChatSession`` use this, so no prompt needs a typed
        BOS."""
        return self._with_bos(np.asarray(self._encode_ids(text), dtype=np.int32))

    def _with_bos(self, ids: np.ndarray) -> np.ndarray:
        """The one BOS policy of prompts: BOS first where the model wants one and ``ids`` lack
        it (``add_special_tokens`` has added it already when on)."""
        if self._options["add_special_tokens"] or not self._add_bos:
            return ids
        bos = self._lookup(self._special_text.get("bos_token"))
        if bos is None or (ids.size and ids[0] == bos):
            return ids
        return np.concatenate([np.asarray([bos], ids.dtype), ids])

    @property
    def has_chat_template(self) -> bool:
        """Whether the folder has a default chat template (so ``apply_chat_template`` needs no
        ``template_str``)."""
        return "default" in self.templates.templates

    def encode_batch(self, texts: Sequence[str]) -> np.ndarray:
        """[batch, max_len] int32 ids, right-padded with ``pad_token_id``."""
        if isinstance(texts, str) or len(texts) == 0:
            raise TokenizerError("EncodeBatch: input strings must not be empty")
        rows = [self._encode_ids(t) for t in texts]
        out = np.full((len(rows), max(len(r) for r in rows)), self._pad, dtype=np.int32)
        for i, row in enumerate(rows):
            out[i, : len(row)] = row
        return out

    def to_token_id(self, token: str) -> int:
        """Id of one token string (an added token or a vocabulary piece); -1 if there is none,
        as the reference returns."""
        if not isinstance(token, str):
            raise TokenizerError(f"to_token_id(token): expected a str, got {type(token).__name__}")
        idx = self._added_ids.get(token)
        if idx is None:
            idx = self._vocab.get(token)
        if idx is None and self._spm and len(token) == 1 and ord(token) < 0x80:
            # sentencepiece byte fallback: " " -> <0x20>, "\n" -> <0x0A>
            idx = self._vocab.get(f"<0x{ord(token):02X}>")
        return -1 if idx is None else int(idx)

    # -- decoding -----------------------------------------------------------------------------

    def _vocab_bytes(self, idx: int) -> bytes | None:
        """Bytes of vocabulary piece ``idx`` (cached), None when ``idx`` is not in the vocab."""
        cached = self._piece_bytes.get(idx)
        if cached is not None:
            return cached
        if not 0 <= idx < len(self._pieces):
            return None
        piece = self._pieces[idx] or ""
        if not self._spm:
            data = byte_level_bytes(piece)
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                data = bytes((int(piece[3:5], 16),))
            except ValueError:
                data = b"\x00"
        else:
            data = piece.replace(SPM_SPACE, " ").encode("utf-8")
        self._piece_bytes[idx] = data
        return data

    def _token_bytes(self, idx: int, prev_special: bool, skip_special: bool) -> tuple[bytes, bool]:
        """Bytes one token contributes and whether it is special (the reference's Id2Token)."""
        special = idx in self._special_ids
        if self._spm:
            if idx in self._added:
                data = b"" if special else self._added[idx].encode("utf-8")
            else:
                data = self._vocab_bytes(idx) if 0 <= idx < len(self._pieces) else None
                if not data:  # out of range or a hole in the vocabulary
                    data = self._unk_text.encode("utf-8")
            if data[:1] == b" " and prev_special and self._dummy_prefix:
                data = data[1:]
            return data, special
        if skip_special and special and not self._never_skip:
            return b"", special
        if idx in self._added:
            data = self._added[idx].encode("utf-8")
        else:
            data = self._vocab_bytes(idx)
            if data is None:
                return (b"", special) if skip_special else (self._unk_text.encode(), special)
        if self._eow_suffix and data.endswith(self._eow_suffix.encode()):
            data = data[: -len(self._eow_suffix.encode())] + b" "
        return data, special

    def _decode_bytes(self, ids: Iterable[int]) -> bytes:
        skip = self._options["skip_special_tokens"]
        out = bytearray()
        prev_special = False
        for idx in ids:
            data, prev_special = self._token_bytes(int(idx), prev_special, skip)
            out += data
        if self._clip and out.endswith(b" "):  # the reference trims CLIP's last space
            del out[-1]
        return bytes(out)

    def decode(self, tokens: Any) -> str:
        """Text of a token sequence; special tokens are skipped (the reference's default).

        Like the reference, bad UTF-8 (e.g. a sequence ending inside a character) ends the text
        with a single U+FFFD at the first bad position.
        """
        return finish_text(self._decode_bytes(_as_ids(tokens).ravel().tolist()))

    def decode_batch(self, tokens: Any) -> list[str]:
        """Decode each row of a [batch, length] array (numpy, nested lists or an og.Tensor)."""
        arr = _as_ids(tokens)
        if arr.ndim != 2:
            raise TokenizerError(
                f"decode_batch expects a 2-D [batch, length] array, got {arr.ndim}-D"
            )
        return [finish_text(self._decode_bytes(row)) for row in arr.tolist()]

    def create_stream(self) -> TokenizerStream:
        """A fresh incremental decoder."""
        return TokenizerStream(self)

    def apply_chat_template(
        self,
        messages: str | Sequence[Mapping[str, Any]],
        *,
        template_str: str | None = None,
        tools: str | Sequence[Any] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """Render a conversation to the prompt text (not tokenized).

        ``messages`` is a JSON string (the reference's form) or a list of dicts; ``tools`` the
        same or None. ``template_str`` overrides the model's own template; ``template_kwargs``
        are further variables it reads (as Hugging Face's keyword arguments: ``enable_thinking``).
        """
        return self.templates.render(
            messages, template_str=template_str, tools=tools,
            add_generation_prompt=add_generation_prompt, special_text=self._special_text,
            variables=template_kwargs,
        )  # fmt: skip


def forged_spans(
    tokens: Sequence[tuple[int, int]], literal: Sequence[tuple[int, int]]
) -> list[tuple[int, int]]:
    """The ``literal`` spans that any of the special ``tokens`` (character spans) overlaps."""
    starts = [start for start, _ in literal]
    hit: set[tuple[int, int]] = set()
    for a, b in tokens:
        k = bisect.bisect_left(starts, b) - 1  # the last span starting before the token ends
        while k >= 0 and literal[k][1] > a:  # spans are disjoint and sorted: ends increase
            hit.add(literal[k])
            k -= 1
    return sorted(hit)


def _token_id(token: Any, what: str) -> int:
    """One token id: a Python or numpy integer (bool and everything else are refused)."""
    if isinstance(token, np.ndarray) and token.size == 1:
        token = token.reshape(()).item()
    if isinstance(token, bool | np.bool_) or not isinstance(token, int | np.integer):
        raise TokenizerError(f"{what}: expected an integer token id, got {type(token).__name__}")
    return int(token)


def _as_ids(tokens: Any) -> np.ndarray:
    """Token ids from numpy, lists, ints or anything with ``as_numpy()`` (og.Tensor-like)."""
    if hasattr(tokens, "as_numpy"):
        tokens = tokens.as_numpy()
    try:
        arr = np.asarray(tokens)
    except (TypeError, ValueError) as exc:
        raise TokenizerError(f"token ids must be integers: {exc}") from exc
    if arr.size == 0:
        return arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise TokenizerError(f"token ids must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


class TokenizerStream:
    """Incremental decoder: ``decode(token)`` returns exactly the new text for that token.

    Works like the reference: each token's bytes join a small pending buffer, and every complete
    UTF-8 character in it is emitted; an unfinished character waits (the call returns "") until
    its last byte arrives. Cost is O(1) per token: only the new token's bytes and at most three
    pending bytes are looked at, never the history. Quirks kept from the reference: a malformed
    character is dropped (not replaced by U+FFFD), and for tokenizers with
    ``clean_up_tokenization_spaces`` a special token yields spaces around it.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._pending = b""
        self._prev_special = False
        self._first = True

    def decode(self, token: int) -> str:
        """Text newly completed by ``token`` (possibly "")."""
        tok = self._tok
        idx = _token_id(token, "TokenizerStream.decode(token)")
        data, special = tok._token_bytes(
            idx, self._prev_special, tok._options["skip_special_tokens"]
        )
        if tok._cleanup_spaces and special:
            if self._first and not self._prev_special:
                data = b" " + data
            if idx != tok._stream_eos_id:
                data += b" "
        self._first = False
        self._prev_special = special
        buf = self._pending + data
        out = bytearray()
        i = done = 0
        while i < len(buf):
            size = UTF8_LEN[buf[i] >> 4]
            if size <= len(buf) - i:
                done += size
                if is_one_valid_char(buf[i : i + size]):
                    out += buf[i : i + size]
            i += size
        self._pending = buf[done:]
        return out.decode("utf-8")


def folder_problems(model_dir: Path | None, tokens: Any, root: Path | None = None) -> list[str]:
    """Load a folder's tokenizer (if it has one) and compile its chat templates (``validate``);
    a ``tokenizer.json`` that is there but is no file is a problem, as it is to ``run``."""
    if model_dir is None:
        return []
    path = model_dir / "tokenizer.json"
    if path.exists() and not path.is_file():
        return [f"{path}: not a file (a tokenizer.json must be the tokenizer's JSON file)"]
    if not path.is_file():
        return []
    try:
        tokenizer = Tokenizer.from_dir(
            model_dir,
            bos_token_id=tokens.bos,
            eos_token_ids=tokens.eos,
            pad_token_id=tokens.pad,
            root=root,
        )
        tokenizer.templates.check()
    except GenaiRuntimeError as exc:
        return [str(exc)]
    return []
