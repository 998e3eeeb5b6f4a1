"""Open a GGUF file and read what an ONNX export needs: hyper-parameters, tensors, vocabulary.

The header is parsed here with ``struct`` (the ``gguf`` package's reader builds a NumPy view per
string and spends ~10 s on a 49k-token vocabulary); tensor data is a read-only memory map and
the ``gguf`` package supplies the block sizes and the dequantisers.

Everything comes from the file's own metadata; the architecture name only selects which key
prefix and which family quirks (``FAMILIES``) apply. A file that cannot be read is a
``ModelError`` naming the file; an architecture we do not build is an ``UnsupportedError``.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..errors import ModelError, UnsupportedError
from . import gguf_checks


@dataclass(frozen=True)
class Family:
    """How one GGUF architecture differs from the plain llama decoder."""

    # llama.cpp's converter permutes Q/K rows for GGML's adjacent-pair rope; we undo it so the
    # graph uses the half-split rotary layout the reference builder writes.
    unpermute_qk: bool
    # Which decoder block the graph builder writes (folder.DECODERS): "llama" or "gemma3"
    # (q/k norms, pre+post norms, scaled embedding, GELU-tanh MLP, local/global layers).
    block: str = "llama"
    # Per-layer norm tensors beyond the llama set, [hidden] and [head_size] wide.
    extra_norms: tuple[str, ...] = ()
    head_norms: tuple[str, ...] = ()
    # Local/global attention: every `global_every`-th layer attends globally, the others through
    # `{arch}.attention.sliding_window` tokens with rope base `local_rope_base`. llama.cpp fixes
    # both per architecture; the GGUF does not store them.
    global_every: int = 0
    local_rope_base: float = 10000.0
    # genai_config.json `model.type` (onnxruntime-genai picks its processor by it).
    genai_type: str | None = None


# One entry per GGUF `general.architecture` we can build; a miss lists these keys.
FAMILIES: dict[str, Family] = {
    "llama": Family(unpermute_qk=True),
    "gemma3": Family(
        unpermute_qk=False,  # converted without the llama permutation (NEOX-style rope)
        block="gemma3",
        extra_norms=("post_attention_norm.weight", "post_ffw_norm.weight"),
        head_norms=("attn_q_norm.weight", "attn_k_norm.weight"),
        global_every=6,
        local_rope_base=10000.0,
        genai_type="gemma3_text",
    ),
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
    sliding_window: int = 0  # 0: every layer attends globally
    local_layers: tuple[int, ...] = ()  # the layers that attend through the sliding window
    final_softcap: float = 0.0  # 0: none (`{arch}.final_logit_softcapping`)
    attn_softcap: float = 0.0  # 0: none (`{arch}.attn_logit_softcapping`)


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


class GGUFModel:
    """A GGUF file opened read-only (memory-mapped): metadata, hyper-parameters, tensors."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
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
        if self.arch not in FAMILIES:
            raise UnsupportedError(
                f"{self.path}: GGUF architecture {self.arch!r} is not supported; "
                f"supported: {', '.join(sorted(FAMILIES))}"
            )
        self.family = FAMILIES[self.arch]
        gguf_checks.check_metadata(self.path, self.fields, self.arch, len(self.tensors))
        self.hyper = self._hyper()
        self._check_tensors()

    # -- metadata --------------------------------------------------------------------------
    def meta(self, key: str, default: Any = ...) -> Any:
        if key not in self.fields:
            if default is ...:
                raise ModelError(f"{self.path}: GGUF metadata key {key!r} is missing")
            return default
        return self.fields[key]

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
        layers = int(self.meta(f"{a}.block_count"))
        window = int(self.meta(f"{a}.attention.sliding_window", 0))
        return Hyper(
            arch=a,
            layers=layers,
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
            sliding_window=window,
            # Only families whose block builds local attention get local layers.
            local_layers=self._local_layers(layers) if window and self.family.global_every else (),
            final_softcap=float(self.meta(f"{a}.final_logit_softcapping", 0.0)),
            attn_softcap=float(self.meta(f"{a}.attn_logit_softcapping", 0.0)),
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
            want |= {p + n: (h.hidden,) for n in self.family.extra_norms}
            want |= {p + n: (h.head_size,) for n in self.family.head_norms}
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
            return tuple(str(x) for x in self.fields.get(key, ()))

        def numbers(key: str) -> tuple[Any, ...]:
            values = self.fields.get(key, ())
            return tuple(values.tolist() if isinstance(values, np.ndarray) else values)

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
