"""Open a GGUF file and read what an ONNX export needs: hyper-parameters, tensors, vocabulary.

The header is parsed here with ``struct`` (the ``gguf`` package's reader builds a NumPy view per
string and spends ~10 s on a 49k-token vocabulary); tensor data is a read-only memory map and
the ``gguf`` package supplies the block sizes and the dequantisers.

Everything comes from the file's own metadata; the architecture name only selects which key
prefix and which family quirks (``checkpoint.FAMILIES``) apply. A file that cannot be read is a
``ModelError`` naming the file; an architecture we do not build is an ``UnsupportedError``.
"""

from __future__ import annotations

import math
import numbers
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..errors import ModelError, UnsupportedError
from . import gguf_checks
from .checkpoint import (
    Hyper,
    Rope,
    SourceWeight,
    check_shapes,
    family_for,
    longrope_scale,
    rope_problem,
)
from .weights import Blocks, check_type, dequantize, to_blocks, type_name, unpermute_rows


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
    # SentencePiece: a "▁" before the text (llama.cpp's default; Gemma's GGUFs turn it off).
    add_space_prefix: bool = True


@dataclass(frozen=True)
class Tensor:
    """One tensor of a GGUF file: ``shape`` is GGML's (ne0 first, the contiguous axis);
    ``data`` holds the raw bytes as [rows, bytes_per_row], memory-mapped."""

    name: str
    shape: tuple[int, ...]
    tensor_type: Any  # gguf.GGMLQuantizationType
    data: np.ndarray


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q"}
_SCALARS |= {11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Header:
    """Sequential little-endian reads that name the offset when the file ends too early."""

    def __init__(self, f: BinaryIO, path: Path):
        self.f, self.path = f, path
        self.size = path.stat().st_size

    def take(self, n: int) -> bytes:
        # Checked before read(n), which allocates n bytes whatever the file holds.
        short = self.f.tell() + n - self.size
        raw = self.f.read(n) if short <= 0 else b""
        if len(raw) != n:
            raise ModelError(
                f"{self.path}: not a readable GGUF file: the header ends at byte {self.size} "
                f"({max(short, n - len(raw))} bytes short); the file may be truncated or corrupt"
            )
        return raw

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > 1 << 30:
            raise ModelError(f"{self.path}: not a readable GGUF file: a string of {n} bytes")
        return self.take(n).decode("utf-8", errors="surrogateescape")

    def value(self, kind: int, keep: bool = True) -> Any:
        """One value; an array is built only when ``keep`` (numbers as a NumPy array)."""
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if item == _STRING:
                if count * 8 > self.size:  # every string takes 8 bytes of length at least
                    self.take(count * 8)  # names the end of the file
                if not keep:
                    for _ in range(count):
                        self.f.seek(self.unpack("<Q"), 1)
                    return gguf_checks.SkippedArray(item, count)
                return [self.string() for _ in range(count)]
            fmt = _SCALARS.get(item)
            if fmt is None:
                raise ModelError(f"{self.path}: not a readable GGUF file: array of type {item}")
            size = struct.calcsize(fmt) * count
            if not keep and self.f.tell() + size <= self.size:
                self.f.seek(size, 1)
                return gguf_checks.SkippedArray(item, count)
            return np.frombuffer(self.take(size), dtype=np.dtype(fmt))
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise ModelError(f"{self.path}: not a readable GGUF file: value type {kind}")
        return self.unpack(fmt)


def read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """(metadata, tensors) of a GGUF v2/v3 file; tensor data stays on disk (memory-mapped)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as f:
        h = _Header(f, path)
        if h.take(4) != b"GGUF":
            raise ModelError(f"{path}: not a readable GGUF file: no GGUF magic at byte 0")
        version = h.unpack("<I")
        if version not in (2, 3):
            raise UnsupportedError(f"{path}: GGUF version {version} is not supported: 2, 3 are")
        n_tensors, n_kv = h.unpack("<Q"), h.unpack("<Q")
        gguf_checks.check_counts(path, n_tensors, n_kv)
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = h.string()
            meta[key] = h.value(h.unpack("<I"), keep=gguf_checks.keeps_array(key))
        align = gguf_checks.alignment(path, meta)
        infos = []
        for _ in range(n_tensors):
            name = h.string()
            n_dims = h.unpack("<I")
            dims = tuple(h.unpack("<Q") for _ in range(min(n_dims, gguf_checks.MAX_DIMS)))
            infos.append((name, dims, h.unpack("<I"), h.unpack("<Q")))
            gguf_checks.check_tensor(path, name, n_dims, dims, infos[-1][3], align)
        start = -(-f.tell() // align) * align
    size = path.stat().st_size
    mm = np.memmap(path, dtype=np.uint8, mode="r") if size > start else np.zeros(0, np.uint8)
    tensors: dict[str, Tensor] = {}
    for name, dims, type_id, offset in infos:
        try:
            qtype = GGMLQuantizationType(type_id)
        except ValueError:
            raise UnsupportedError(
                f"{path}: tensor {name!r} has unknown GGML type {type_id}"
            ) from None
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        if not dims or dims[0] % block:
            raise ModelError(
                f"{path}: tensor {name!r} shape {list(dims)} does not fit {qtype.name}"
            )
        row_bytes = dims[0] // block * block_bytes
        rows = math.prod(dims[1:])
        begin, end = start + offset, start + offset + rows * row_bytes
        if end > size:
            raise ModelError(
                f"{path}: not a readable GGUF file: tensor {name!r} needs bytes up to {end} but "
                f"the file has {size}; the file may be truncated or corrupt"
            )
        tensors[name] = Tensor(name, dims, qtype, mm[begin:end].reshape(rows, row_bytes))
    return meta, tensors


# llama.cpp's general.sampling.* keys -> (search option, its type)
_SAMPLING_KEYS = (
    ("temp", "temperature", float),
    ("top_k", "top_k", int),
    ("top_p", "top_p", float),
    ("min_p", "min_p", float),
    ("penalty_repeat", "repetition_penalty", float),
)


class GGUFModel:
    """A GGUF file opened read-only (memory-mapped): metadata, hyper-parameters, tensors; a
    ``checkpoint.Checkpoint`` (tensors under their GGUF names, rows in half-split rope order)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.source = str(self.path)
        if not self.path.is_file():
            raise ModelError(f"GGUF file not found: {self.path}")
        try:
            import gguf  # noqa: F401 (block sizes and dequantisers)
        except ImportError as exc:  # the reader is an optional extra
            raise UnsupportedError(
                "importing GGUF needs the 'gguf' extra: pip install 'genai_runtime[gguf]'"
            ) from exc
        try:
            self.fields, self.tensors = read_gguf(self.path)
        except (ModelError, UnsupportedError):
            raise
        except (OSError, ValueError, UnicodeError, OverflowError, MemoryError) as exc:
            raise ModelError(
                f"{self.path}: not a readable GGUF file ({type(exc).__name__}: {exc})"
            ) from exc
        self.arch = str(self.meta("general.architecture"))
        self.family = family_for(self.arch, self.source, "GGUF architecture")
        gguf_checks.check_metadata(self.path, self.fields, self.arch, len(self.tensors))
        for t in self.tensors.values():
            check_type(t, self.source)
        self.hyper = self._hyper()
        problem = rope_problem(self.hyper)
        if problem:
            raise ModelError(f"{self.path}: rope metadata and factor tensors: {problem}")
        check_shapes(self, "the GGUF metadata")

    # -- metadata --------------------------------------------------------------------------
    def meta(self, key: str, default: Any = ...) -> Any:
        if key not in self.fields:
            if default is ...:
                raise ModelError(f"{self.path}: GGUF metadata key {key!r} is missing")
            return default
        return self.fields[key]

    def sampling_defaults(self) -> dict[str, Any]:
        """The makers' recommended sampling, where the file records it (``general.sampling.*``,
        llama.cpp's keys), in search-option names; ``{}`` when it records none."""
        out: dict[str, Any] = {}
        for key, name, kind in _SAMPLING_KEYS:
            value = self.fields.get(f"general.sampling.{key}")
            number = isinstance(value, numbers.Real) and not isinstance(value, bool)
            if number and math.isfinite(value):
                out[name] = kind(value)
        if "temperature" in out:
            out["do_sample"] = out["temperature"] > 0
        return out

    def _hyper(self) -> Hyper:
        a = self.arch
        hidden = int(self.meta(f"{a}.embedding_length"))
        heads = int(self.meta(f"{a}.attention.head_count"))
        kv_heads = int(self.meta(f"{a}.attention.head_count_kv", heads))
        head_size = int(self.meta(f"{a}.attention.key_length", hidden // heads))
        embed = self.tensor("token_embd.weight")
        vocab = int(self.meta(f"{a}.vocab_size", int(embed.shape[1])))
        layers = int(self.meta(f"{a}.block_count"))
        window = int(self.meta(f"{a}.attention.sliding_window", 0))
        context = int(self.meta(f"{a}.context_length"))
        if window and self.family.global_every:
            local = self._local_layers(layers)
        else:  # a window, where the file states one, applies to every layer
            local = tuple(range(layers)) if window else ()
        return Hyper(
            arch=a,
            layers=layers,
            hidden=hidden,
            intermediate=int(self.meta(f"{a}.feed_forward_length")),
            heads=heads,
            kv_heads=kv_heads,
            head_size=head_size,
            vocab=vocab,
            context_length=context,
            rms_eps=float(self.meta(f"{a}.attention.layer_norm_rms_epsilon")),
            rope=self._rope(head_size, context),
            tied_embeddings="output.weight" not in self.tensors,
            sliding_window=window,
            local_layers=local,
            final_softcap=float(self.meta(f"{a}.final_logit_softcapping", 0.0)),
            attn_softcap=float(self.meta(f"{a}.attn_logit_softcapping", 0.0)),
        )

    def _rope(self, head_size: int, context: int) -> Rope:
        """Base, dimension and scaling from the metadata; per-dimension factors from the
        ``rope_freqs`` (Llama 3) or ``rope_factors_short/long`` (Phi-3 longrope) tensors."""
        a = self.arch
        scaling = self.meta(f"{a}.rope.scaling.type", "none")
        if scaling not in ("none", "linear", "longrope", "yarn"):
            raise UnsupportedError(
                f"{self.path}: rope scaling {scaling!r} is not supported; supported: linear, "
                "longrope, none"
            )
        if scaling == "yarn":
            raise UnsupportedError(f"{self.path}: rope scaling 'yarn' is not supported")
        factor = float(self.meta(f"{a}.rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0

        def factors(name: str) -> tuple[float, ...]:
            return tuple(self.weight(name).fp32().tolist()) if name in self.tensors else ()

        short = factors("rope_freqs.weight") or factors("rope_factors_short.weight")
        long = factors("rope_factors_long.weight")
        original = int(self.meta(f"{a}.rope.scaling.original_context_length", 0))
        attn = self.meta(f"{a}.rope.scaling.attn_factor", None)
        if attn is None:
            attn = longrope_scale(context, original) if long else 1.0
        return Rope(
            base=float(self.meta(f"{a}.rope.freq_base", 10000.0)),
            dim=int(self.meta(f"{a}.rope.dimension_count", head_size)),
            linear=factor,
            factors=short,
            long_factors=long,
            original_context=original,
            attn_factor=float(attn),
        )

    def _local_layers(self, layers: int) -> tuple[int, ...]:
        """Sliding-window layers: from ``{arch}.attention.sliding_window_pattern`` (every Nth
        layer global, or one flag per layer) when the file has it, else the family's pattern."""
        pattern = self.meta(f"{self.arch}.attention.sliding_window_pattern", None)
        if isinstance(pattern, np.ndarray):
            pattern = pattern.tolist()
        if isinstance(pattern, list):
            if len(pattern) != layers:
                raise ModelError(
                    f"{self.path}: {self.arch}.attention.sliding_window_pattern has "
                    f"{len(pattern)} flags for {layers} layers"
                )
            return tuple(i for i, local in enumerate(pattern) if local)
        every = int(pattern) if pattern is not None else self.family.global_every
        if every <= 0:  # llama.cpp: pattern 0 means every layer is local
            return tuple(range(layers))
        return tuple(i for i in range(layers) if (i + 1) % every)

    # -- tensors (checkpoint.Checkpoint) ---------------------------------------------------
    def has(self, name: str) -> bool:
        return name in self.tensors

    def describe(self, name: str) -> str:
        return f"tensor {name!r}"

    def tensor(self, name: str) -> Tensor:
        t = self.tensors.get(name)
        if t is None:
            raise ModelError(f"{self.path}: tensor {name!r} is missing")
        return t

    def weight(self, name: str) -> SourceWeight:
        t = self.tensor(name)
        rows = self._rows(name, t)

        def fp32() -> np.ndarray:
            w = dequantize(t)
            return w if rows is None else w[rows]

        def native() -> Blocks | None:
            b = to_blocks(t)
            return b if b is None or rows is None else b.rows(rows)

        shape = tuple(int(d) for d in reversed(t.shape))
        return SourceWeight(name, shape, type_name(t), fp32, native)

    def _rows(self, name: str, t: Tensor) -> np.ndarray | None:
        """The row order undoing llama.cpp's Q/K permutation, for the families that have it."""
        if not self.family.unpermute_qk or len(t.shape) < 1:
            return None
        h = getattr(self, "hyper", None)
        if h is None:
            return None
        heads = {"attn_q": h.heads, "attn_k": h.kv_heads}.get(name.split(".")[-2])
        if heads is None or not name.startswith("blk."):
            return None
        rows = int(t.shape[-1]) if len(t.shape) > 1 else int(t.shape[0])
        return unpermute_rows(heads, rows)

    # -- vocabulary ------------------------------------------------------------------------
    def vocab(self) -> Vocab:
        return vocab_from_metadata(self.fields, self.path)


def vocab_from_metadata(fields: dict[str, Any], path: Path) -> Vocab:
    """The tokenizer a GGUF's ``tokenizer.ggml.*`` metadata describes."""

    def meta(key: str, default: Any = ...) -> Any:
        if key not in fields and default is ...:
            raise ModelError(f"{path}: GGUF metadata key {key!r} is missing")
        return fields.get(key, default)

    def strings(key: str) -> tuple[str, ...]:
        return tuple(str(x) for x in fields.get(key, ()))

    def numbers(key: str) -> tuple[Any, ...]:
        values = fields.get(key, ())  # the reader keeps numeric arrays as NumPy arrays
        return tuple(values.tolist() if isinstance(values, np.ndarray) else values)

    def opt_int(key: str) -> int | None:
        value = meta(key, None)
        return None if value is None else int(value)

    tokens = strings("tokenizer.ggml.tokens")
    if not tokens:
        raise ModelError(f"{path}: no tokenizer vocabulary (tokenizer.ggml.tokens)")
    return Vocab(
        model=str(meta("tokenizer.ggml.model")),
        pre=str(meta("tokenizer.ggml.pre", "default")),
        tokens=tokens,
        token_types=numbers("tokenizer.ggml.token_type") or (1,) * len(tokens),
        merges=strings("tokenizer.ggml.merges"),
        scores=numbers("tokenizer.ggml.scores"),
        bos_id=opt_int("tokenizer.ggml.bos_token_id"),
        eos_id=opt_int("tokenizer.ggml.eos_token_id"),
        unk_id=opt_int("tokenizer.ggml.unknown_token_id"),
        pad_id=opt_int("tokenizer.ggml.padding_token_id"),
        add_bos=bool(meta("tokenizer.ggml.add_bos_token", False)),
        add_eos=bool(meta("tokenizer.ggml.add_eos_token", False)),
        chat_template=meta("tokenizer.chat_template", None),
        add_space_prefix=bool(meta("tokenizer.ggml.add_space_prefix", True)),
    )
