"""Open a GGUF file and read what an ONNX export needs: hyper-parameters, tensors, vocabulary.

Everything comes from the file's own metadata; the architecture name only selects which key
prefix and which family quirks (``FAMILIES``) apply. A file that cannot be read is a
``ModelError`` naming the file; an architecture we do not build is an ``UnsupportedError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelError, UnsupportedError


@dataclass(frozen=True)
class Family:
    """How one GGUF architecture differs from the plain llama decoder."""

    # llama.cpp's converter permutes Q/K rows for GGML's adjacent-pair rope; we undo it so the
    # graph uses the half-split rotary layout the reference builder writes.
    unpermute_qk: bool


# One entry per GGUF `general.architecture` we can build; a miss lists these keys.
FAMILIES: dict[str, Family] = {
    "llama": Family(unpermute_qk=True),
}


@dataclass(frozen=True)
class Hyper:
    """Decoder hyper-parameters, as the GGUF metadata states them."""

    arch: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_size: int
    vocab: int
    context_length: int
    rms_eps: float
    rope_base: float
    rope_dim: int
    rope_linear_factor: float
    tied_embeddings: bool


@dataclass(frozen=True)
class Vocab:
    """The tokenizer as GGUF stores it (``tokenizer.ggml.*``)."""

    model: str
    pre: str
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    scores: tuple[float, ...]
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    chat_template: str | None


class GGUFModel:
    """A GGUF file opened read-only (memory-mapped): metadata, hyper-parameters, tensors."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelError(f"GGUF file not found: {self.path}")
        try:
            from gguf import GGUFReader
        except ImportError as exc:  # the reader is an optional extra
            raise UnsupportedError(
                "importing GGUF needs the 'gguf' extra: pip install 'genai_runtime[gguf]'"
            ) from exc
        try:
            self._reader = GGUFReader(str(self.path), "r")
        except Exception as exc:  # the reader raises bare ValueError/IndexError/etc. on bad bytes
            raise ModelError(
                f"{self.path}: not a readable GGUF file ({type(exc).__name__}: {exc}); "
                "the file may be truncated or corrupt"
            ) from exc
        self.tensors = {t.name: t for t in self._reader.tensors}
        self.arch = str(self.meta("general.architecture"))
        if self.arch not in FAMILIES:
            raise UnsupportedError(
                f"{self.path}: GGUF architecture {self.arch!r} is not supported; "
                f"supported: {', '.join(sorted(FAMILIES))}"
            )
        self.family = FAMILIES[self.arch]
        self.hyper = self._hyper()
        self._check_tensors()

    # -- metadata --------------------------------------------------------------------------
    def meta(self, key: str, default: Any = ...) -> Any:
        field = self._reader.fields.get(key)
        if field is None:
            if default is ...:
                raise ModelError(f"{self.path}: GGUF metadata key {key!r} is missing")
            return default
        try:
            return field.contents()
        except Exception as exc:
            raise ModelError(f"{self.path}: GGUF metadata key {key!r} is unreadable") from exc

    def _hyper(self) -> Hyper:
        a = self.arch
        hidden = int(self.meta(f"{a}.embedding_length"))
        heads = int(self.meta(f"{a}.attention.head_count"))
        kv_heads = int(self.meta(f"{a}.attention.head_count_kv", heads))
        head_size = int(self.meta(f"{a}.attention.key_length", hidden // heads))
        embed = self.tensor("token_embd.weight")
        vocab = int(self.meta(f"{a}.vocab_size", int(embed.shape[1])))
        scaling = self.meta(f"{a}.rope.scaling.type", "none")
        if scaling not in ("none", "linear"):
            raise UnsupportedError(
                f"{self.path}: rope scaling {scaling!r} is not supported; supported: linear, none"
            )
        factor = float(self.meta(f"{a}.rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0
        return Hyper(
            arch=a,
            layers=int(self.meta(f"{a}.block_count")),
            hidden=hidden,
            intermediate=int(self.meta(f"{a}.feed_forward_length")),
            heads=heads,
            kv_heads=kv_heads,
            head_size=head_size,
            vocab=vocab,
            context_length=int(self.meta(f"{a}.context_length")),
            rms_eps=float(self.meta(f"{a}.attention.layer_norm_rms_epsilon")),
            rope_base=float(self.meta(f"{a}.rope.freq_base", 10000.0)),
            rope_dim=int(self.meta(f"{a}.rope.dimension_count", head_size)),
            rope_linear_factor=factor,
            tied_embeddings="output.weight" not in self.tensors,
        )

    def _check_tensors(self) -> None:
        h = self.hyper
        want = {"token_embd.weight": (h.hidden, h.vocab), "output_norm.weight": (h.hidden,)}
        for i in range(h.layers):
            p = f"blk.{i}."
            want |= {
                p + "attn_norm.weight": (h.hidden,),
                p + "attn_q.weight": (h.hidden, h.heads * h.head_size),
                p + "attn_k.weight": (h.hidden, h.kv_heads * h.head_size),
                p + "attn_v.weight": (h.hidden, h.kv_heads * h.head_size),
                p + "attn_output.weight": (h.heads * h.head_size, h.hidden),
                p + "ffn_norm.weight": (h.hidden,),
                p + "ffn_gate.weight": (h.hidden, h.intermediate),
                p + "ffn_up.weight": (h.hidden, h.intermediate),
                p + "ffn_down.weight": (h.intermediate, h.hidden),
            }
        if not h.tied_embeddings:
            want["output.weight"] = (h.hidden, h.vocab)
        problems = []
        for name, shape in want.items():
            t = self.tensors.get(name)
            if t is None:
                problems.append(f"tensor {name!r} is missing")
            elif tuple(int(d) for d in t.shape) != shape:
                problems.append(
                    f"tensor {name!r} has shape {list(map(int, t.shape))}, expected {list(shape)}"
                )
        if problems:
            raise ModelError(f"{self.path}: " + "; ".join(problems))

    def tensor(self, name: str) -> Any:
        t = self.tensors.get(name)
        if t is None:
            raise ModelError(f"{self.path}: tensor {name!r} is missing")
        return t

    # -- vocabulary ------------------------------------------------------------------------
    def vocab(self) -> Vocab:
        def strings(key: str) -> tuple[str, ...]:
            field = self._reader.fields.get(key)
            if field is None:
                return ()
            return tuple(
                bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data
            )

        def numbers(key: str) -> tuple[Any, ...]:
            field = self._reader.fields.get(key)
            if field is None:
                return ()
            return tuple(field.parts[i][0].item() for i in field.data)

        def opt_int(key: str) -> int | None:
            value = self.meta(key, None)
            return None if value is None else int(value)

        tokens = strings("tokenizer.ggml.tokens")
        if not tokens:
            raise ModelError(f"{self.path}: no tokenizer vocabulary (tokenizer.ggml.tokens)")
        return Vocab(
            model=str(self.meta("tokenizer.ggml.model")),
            pre=str(self.meta("tokenizer.ggml.pre", "default")),
            tokens=tokens,
            token_types=numbers("tokenizer.ggml.token_type") or (1,) * len(tokens),
            merges=strings("tokenizer.ggml.merges"),
            scores=numbers("tokenizer.ggml.scores"),
            bos_id=opt_int("tokenizer.ggml.bos_token_id"),
            eos_id=opt_int("tokenizer.ggml.eos_token_id"),
            unk_id=opt_int("tokenizer.ggml.unknown_token_id"),
            pad_id=opt_int("tokenizer.ggml.padding_token_id"),
            add_bos=bool(self.meta("tokenizer.ggml.add_bos_token", False)),
            add_eos=bool(self.meta("tokenizer.ggml.add_eos_token", False)),
            chat_template=self.meta("tokenizer.chat_template", None),
        )


def rope_cos_sin(h: Hyper, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [positions, rope_dim/2] from the GGUF's rope base and linear factor."""
    inv_freq = 1.0 / (h.rope_base ** (np.arange(0, h.rope_dim, 2, dtype=np.float64) / h.rope_dim))
    t = np.arange(positions, dtype=np.float64) / h.rope_linear_factor
    freqs = np.outer(t, inv_freq)
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)
