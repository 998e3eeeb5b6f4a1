"""What the graph builders read from a checkpoint, whichever file format it came in.

Two readers fill it: ``gguf_file.GGUFModel`` (a GGUF file) and ``hf_folder.HFCheckpoint`` (a
Hugging Face folder of ``config.json`` + ``*.safetensors``). Both name tensors the GGUF way
(``blk.N.attn_q.weight``), store weights as [out_features, in_features] with rows in the
half-split rotary order, and describe the decoder with one ``Hyper``; so one graph builder writes
the same graph from either.

What a checkpoint *has* decides the graph (q/k/v biases, q/k norms, fused qkv or gate_up,
sliding-window layers, rope factors); the architecture name only picks a ``Family``: which
decoder block, and the few facts neither file states.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..errors import ModelError, UnsupportedError


@dataclass(frozen=True)
class Family:
    """How one architecture differs from the plain llama decoder."""

    # Which decoder block the graph builder writes (folder.DECODERS): "llama" or "gemma3"
    # (q/k norms, pre+post norms, scaled embedding, GELU-tanh MLP, local/global layers).
    block: str = "llama"
    # GGUF only: llama.cpp's converter permutes Q/K rows for GGML's adjacent-pair rope; the
    # reader undoes it so the graph uses the half-split rotary layout the reference writes.
    unpermute_qk: bool = False
    # config.json ``model_type`` values read as this family.
    hf_types: tuple[str, ...] = ()
    # Per-layer norm tensors beyond the llama set, [hidden] wide.
    extra_norms: tuple[str, ...] = ()
    # Gemma multiplies by ``1 + w``: the GGUF stores ``w + 1``, a Hugging Face folder ``w``.
    hf_norm_offset: float = 0.0
    # Hugging Face per-layer names that differ from the llama ones (HF suffix -> GGUF suffix).
    hf_renames: tuple[tuple[str, str], ...] = ()
    # Local/global attention when the GGUF states no pattern: every `global_every`-th layer
    # attends globally, the others through the window (llama.cpp fixes it per architecture).
    global_every: int = 0
    # genai_config.json `model.type` (onnxruntime-genai picks its processor by it).
    genai_type: str | None = None


# One entry per architecture (GGUF `general.architecture`) we can build; a miss lists the keys.
FAMILIES: dict[str, Family] = {
    "llama": Family(unpermute_qk=True, hf_types=("llama", "mistral")),
    "qwen2": Family(hf_types=("qwen2",), genai_type="qwen2"),
    "qwen3": Family(hf_types=("qwen3",), genai_type="qwen3"),
    "phi3": Family(hf_types=("phi3",), genai_type="phi3"),
    "gemma3": Family(
        block="gemma3",
        hf_types=("gemma3_text",),
        extra_norms=("post_attention_norm.weight", "post_ffw_norm.weight"),
        hf_norm_offset=1.0,
        hf_renames=(
            ("post_attention_layernorm.weight", "post_attention_norm.weight"),
            ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
            ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
        ),
        global_every=6,
        genai_type="gemma3_text",
    ),
}


def family_for(arch: str, source: str, what: str = "architecture") -> Family:
    if arch not in FAMILIES:
        raise UnsupportedError(
            f"{source}: {what} {arch!r} is not supported; supported: {', '.join(sorted(FAMILIES))}"
        )
    return FAMILIES[arch]


@dataclass(frozen=True)
class Rope:
    """Rotary embedding: inv_freq[i] = 1 / (base^(2i/dim) * factors[i]), positions divided by
    ``linear``; cos/sin scaled by ``attn_factor``. ``long_factors`` (Phi-3's longrope) replace
    ``factors`` once a sequence is longer than ``original_context``."""

    base: float
    dim: int
    linear: float = 1.0
    factors: tuple[float, ...] = ()
    long_factors: tuple[float, ...] = ()
    original_context: int = 0
    attn_factor: float = 1.0


@dataclass(frozen=True)
class Hyper:
    """Decoder hyper-parameters, as the checkpoint states them."""

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
    rope: Rope
    tied_embeddings: bool
    sliding_window: int = 0  # 0: every layer attends globally
    local_layers: tuple[int, ...] = ()  # the layers that attend through the sliding window
    local_rope_base: float = 10000.0  # Gemma 3's local layers
    final_softcap: float = 0.0  # 0: none
    attn_softcap: float = 0.0  # 0: none
    query_scale: float = 0.0  # 0: 1/sqrt(head_size)

    @property
    def rope_base(self) -> float:
        return self.rope.base


def inverse_frequencies(rope: Rope, long: bool = False) -> np.ndarray:
    """inv_freq [rope.dim/2] (float64), the linear factor and per-dimension factors applied
    (``long``: ``rope.long_factors``)."""
    exponent = np.arange(0, rope.dim, 2, dtype=np.float64) / rope.dim
    inv_freq = 1.0 / (rope.base**exponent) / rope.linear
    factors = rope.long_factors if long else rope.factors
    if factors:
        inv_freq = inv_freq / np.asarray(factors, np.float64)
    return inv_freq


def rope_problem(h: Hyper) -> str | None:
    """What makes the rotary tables unusable in the fp32 graph (None: nothing): a tiny base or
    factor overflows the inverse frequencies, a NaN factor poisons them."""
    local = dataclasses.replace(h.rope, base=h.local_rope_base, linear=1.0, factors=())
    ropes = [(h.rope, False), (h.rope, True)] if h.rope.long_factors else [(h.rope, False)]
    if h.local_layers:
        ropes.append((local, False))
    with np.errstate(all="ignore"):
        for rope, long in ropes:
            inv = inverse_frequencies(rope, long)
            if not np.all(np.isfinite(inv) & (np.abs(inv) < np.finfo(np.float32).max)):
                return (
                    f"rope base {rope.base} and its scaling give inverse frequencies outside "
                    "float32's range"
                )
    return None


@dataclass(frozen=True)
class SourceWeight:
    """One tensor of a checkpoint, read on demand: ``fp32()`` [out, in] (or [n]) in the graph's
    row order; ``native()`` the file's own quantised blocks as MatMulNBits blocks when they map
    exactly (``weights.Blocks``), else None."""

    name: str
    shape: tuple[int, ...]  # [out, in] for a matrix
    kind: str  # GGML type name or safetensors dtype, for reports
    fp32: Callable[[], np.ndarray]
    native: Callable[[], Any] = field(default=lambda: None)


class Checkpoint(Protocol):
    """A decoder checkpoint as the graph builders read it."""

    arch: str
    family: Family
    hyper: Hyper
    source: str  # the file or folder, for messages and reports

    def has(self, name: str) -> bool: ...

    def weight(self, name: str) -> SourceWeight: ...

    def describe(self, name: str) -> str:
        """Where tensor ``name`` lives, in the file's own terms (for messages)."""
        ...

    def sampling_defaults(self) -> dict[str, Any]:
        """The makers' recommended sampling the checkpoint records, as search options."""
        ...


def expected_shapes(ckpt: Checkpoint) -> dict[str, tuple[int, ...]]:
    """Every tensor the decoder needs, [out, in], as the hyper-parameters imply. Fused q/k/v and
    gate/up, biases and q/k norms are expected where the checkpoint has them."""
    h = ckpt.hyper
    q, kv = h.heads * h.head_size, h.kv_heads * h.head_size
    want: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (h.vocab, h.hidden),
        "output_norm.weight": (h.hidden,),
    }
    for i in range(h.layers):
        p = f"blk.{i}."
        want[p + "attn_norm.weight"] = (h.hidden,)
        want[p + "attn_output.weight"] = (h.hidden, q)
        want[p + "ffn_norm.weight"] = (h.hidden,)
        want[p + "ffn_down.weight"] = (h.hidden, h.intermediate)
        if ckpt.has(p + "attn_qkv.weight"):
            want[p + "attn_qkv.weight"] = (q + 2 * kv, h.hidden)
        else:
            want |= {
                p + "attn_q.weight": (q, h.hidden),
                p + "attn_k.weight": (kv, h.hidden),
                p + "attn_v.weight": (kv, h.hidden),
            }
        for part, rows in (("q", q), ("k", kv), ("v", kv)):
            if ckpt.has(f"{p}attn_{part}.bias"):
                want[f"{p}attn_{part}.bias"] = (rows,)
        if ckpt.has(p + "attn_qkv.bias"):
            want[p + "attn_qkv.bias"] = (q + 2 * kv,)
        if ckpt.has(p + "attn_q_norm.weight") or ckpt.family.block == "gemma3":
            want[p + "attn_q_norm.weight"] = (h.head_size,)
            want[p + "attn_k_norm.weight"] = (h.head_size,)
        if ckpt.has(p + "ffn_gate.weight"):
            want[p + "ffn_gate.weight"] = (h.intermediate, h.hidden)
            want[p + "ffn_up.weight"] = (h.intermediate, h.hidden)
        else:  # fused gate_up (Phi-3): gate rows first
            want[p + "ffn_up.weight"] = (2 * h.intermediate, h.hidden)
        want |= {p + n: (h.hidden,) for n in ckpt.family.extra_norms}
    if not h.tied_embeddings:
        want["output.weight"] = (h.vocab, h.hidden)
    return want


def check_shapes(ckpt: Checkpoint, origin: str) -> None:
    """A ``ModelError`` naming every missing tensor and every shape that disagrees with the
    hyper-parameters (``origin`` says where those came from, e.g. "config.json")."""
    problems = []
    for name, shape in expected_shapes(ckpt).items():
        if not ckpt.has(name):
            problems.append(f"{ckpt.describe(name)} is missing")
            continue
        got = tuple(int(d) for d in ckpt.weight(name).shape)
        if got != shape:
            problems.append(
                f"{ckpt.describe(name)} has shape {list(got)}, but {origin} implies {list(shape)}"
            )
    if problems:
        raise ModelError(f"{ckpt.source}: " + "; ".join(problems))


def longrope_scale(context: int, original: int) -> float:
    """Phi-3's longrope cos/sin scale: sqrt(1 + ln(context / original) / ln(original))."""
    if original <= 1 or context <= original:  # ln(1) = 0 would divide by zero
        return 1.0
    return math.sqrt(1 + math.log(context / original) / math.log(original))
