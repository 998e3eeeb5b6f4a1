"""Weights into graph nodes, by the chosen ``--quant`` and ``--accuracy-level``.

Per weight matrix (``Linear.plan``):

- ``fp32`` / ``fp16``: the weight dequantised (``fp16``: stored half size, cast to fp32 at load).
- ``int4`` (the default) / ``int8``: the checkpoint's own blocks when they map onto MatMulNBits
  exactly (``weights.to_blocks``: 4-bit GGUF types stay 4-bit, wider ones become 8-bit; with
  ``int8`` 4-bit blocks are widened, still exact); otherwise symmetric round-to-nearest blocks of
  32 (``quantise.rtn_blocks``, what the reference builder writes). 8-bit MatMulNBits is fast only
  with int8 activations, so at accuracy level 0 exact 8-bit blocks are dequantised to fp32.
- ``int4-wide``: as ``int4``, but at accuracy level 4 narrow 8-bit blocks (Q6_K's 16, Q5_0's 32)
  become 8-bit blocks of 128 where that adds under a quarter of the source's own rounding noise
  (``quantise.wide_eight_bit``); Q8_0 stays exact. Faster kernels, fewer bytes; onnxruntime then
  rounds those matrices' int8 activations per 128 values too.
- ``int8-wide``: as ``int8`` (every GGUF block widened to 8 bits), then the same widening to
  blocks of 128: a Q4_K block's values re-rounded to 8 bits move by about a hundredth of its own
  rounding noise. More bytes than ``int4``, but onnxruntime's kernel for 8-bit blocks of 128 is
  the fastest it has for both prefill and decode on CPUs with int8 dot products.
- ``int4-lean``: as ``int4``, but blocks that MatMulNBits can hold exactly only with a float
  offset (Q4_K, Q4_1) or with blocks of 16 (Q6_K) are re-rounded to its leaner forms
  (``quantise.lean_blocks``): 4-bit with integer zero points (one MatMulNBits, no offset
  MatMul), 8-bit blocks of 32. Fewer bytes a token reads, at a small, measured error.

The token embedding is kept as the checkpoint has it when its blocks map (GatherBlockQuantized;
a tied lm_head reads the same initializers). A float table is quantised like the other weights
when the head is tied to it (one table for both, as the reference builder shares it), and kept
in fp32 when the head is separate (as the reference keeps it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .checkpoint import Checkpoint, SourceWeight
from .graph import BuildReport, GraphBuilder
from .quantise import LEAN, QUANTS, RTN_BLOCK, lean_blocks, rtn_blocks, wide_eight_bit
from .weights import Blocks

FAST_ACCURACY = 4  # MatMulNBits accuracy_level with int8 activations
# int4 / int8's blocks with the 8-bit ones widened to 128 values where the weights allow
WIDE = ("int4-wide", "int8-wide")


@dataclass
class Linear:
    """x @ W.T for checkpoint weights W [out, in], stacked along out (one node for q/k/v or
    gate/up where their formats agree, else one per format and a Concat), biases added after."""

    ckpt: Checkpoint
    g: GraphBuilder
    quant: str
    accuracy_level: int
    total: int  # weight matrices in the model, for ``progress``
    progress: Callable[[str, int], None] | None
    formats: list[tuple[str, str]] = field(default_factory=list)
    nbits: list[str] = field(default_factory=list)
    floats: list[str] = field(default_factory=list)

    def plan(self, w: SourceWeight, head: bool = False) -> tuple[Blocks | np.ndarray, str]:
        """(Blocks or float array [out, in], how) for one weight (``head``: the output head)."""
        bits = QUANTS[self.quant]
        if bits is None:
            dtype = np.float16 if self.quant == "fp16" else np.float32
            return w.fp32().astype(dtype, copy=False), f"{self.quant} from {w.kind}"
        if w.shape[-1] % RTN_BLOCK:
            return w.fp32(), f"fp32 from {w.kind} (in_features not a multiple of {RTN_BLOCK})"
        native = w.native()
        if native is not None:
            how = "exact"
            if self.quant == LEAN:
                native, how = lean_blocks(native, head)
            if native.bits == 8 and self.accuracy_level < FAST_ACCURACY:
                return w.fp32(), f"fp32 from {w.kind} (exact; 8-bit blocks need accuracy level 4)"
            if bits == 8:
                native = native.widened()
            if self.quant in WIDE:
                native, how = wide_eight_bit(native)
            return native, f"int{native.bits} from {w.kind} ({how})"
        return rtn_blocks(w.fp32(), bits), f"int{bits} RTN from {w.kind}"

    def _record(self, name: str, value: Blocks | np.ndarray, how: str) -> None:
        (self.nbits if isinstance(value, Blocks) else self.floats).append(name)
        self.formats.append((name, how))

    def __call__(
        self, x: str, names: list[str], onnx_name: str, biases: list[str] | None = None
    ) -> str:
        groups: list[tuple[Any, list[Blocks | np.ndarray]]] = []
        for name in names:
            if self.progress:
                self.progress(name, self.total)
            value, how = self.plan(self.ckpt.weight(name), head=onnx_name == "lm_head")
            self._record(name, value, how)
            key = (value.bits, value.block) if isinstance(value, Blocks) else value.dtype
            if groups and groups[-1][0] == key:
                groups[-1][1].append(value)
            else:
                groups.append((key, [value]))
        outs = []
        for j, (_, parts) in enumerate(groups):
            tag = onnx_name if len(groups) == 1 else f"{onnx_name}.part{j}"
            if isinstance(parts[0], Blocks):
                outs.append(matmul_nbits(self.g, x, Blocks.stack(parts), tag, self.accuracy_level))
            else:
                w = np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
                outs.append(self.g.op("MatMul", [x, self.float_const(tag + ".weight", w.T)]))
        y = outs[0] if len(outs) == 1 else self.g.op("Concat", outs, axis=-1)
        return self.add_bias(y, names, biases or [], onnx_name)

    def add_bias(self, y: str, names: list[str], biases: list[str], onnx_name: str) -> str:
        """y + the biases of ``names`` (those the checkpoint has; zeros for the others)."""
        present = [b for b in biases if self.ckpt.has(b)]
        if not present:
            return y
        parts = []
        for name, bias in zip(names, biases):
            rows = self.ckpt.weight(name).shape[0]
            parts.append(
                self.ckpt.weight(bias).fp32() if self.ckpt.has(bias) else np.zeros(rows, np.float32)
            )
        b = np.concatenate(parts).astype(np.float32)
        return self.g.op("Add", [y, self.g.const(onnx_name + ".bias", b)])

    def float_const(self, name: str, array: np.ndarray) -> str:
        """An fp32 initializer; fp16 ones are cast at load (the folder holds half the bytes)."""
        const = self.g.const(name, np.ascontiguousarray(array))
        return const if array.dtype == np.float32 else self.g.op("Cast", [const], to=1)

    def report(self) -> BuildReport:
        return BuildReport(tuple(self.nbits), tuple(self.floats), tuple(self.formats))


@dataclass
class Table:
    """The token embedding: quantised blocks read by GatherBlockQuantized (shared with a tied
    lm_head), or a float table read by Gather."""

    name: str
    blocks: Blocks | None = None
    floats: np.ndarray | None = None


def embedding(linear: Linear) -> Table:
    name = "token_embd.weight"
    if linear.progress:
        linear.progress(name, linear.total)
    w = linear.ckpt.weight(name)
    if QUANTS[linear.quant] is None:
        value, how = linear.plan(w)
    else:
        native = w.native()
        if native is not None:
            how = "exact"
            if linear.quant == LEAN:  # the tied head reads these blocks too
                native, how = lean_blocks(native, head=linear.ckpt.hyper.tied_embeddings)
            elif linear.quant in WIDE and linear.accuracy_level >= FAST_ACCURACY:
                native, how = wide_eight_bit(native)
            linear._record(name, native, f"int{native.bits} from {w.kind} ({how})")
            return Table("embed_tokens", blocks=native)
        if linear.ckpt.hyper.tied_embeddings:
            # One quantised table for the lookup and the head, as the reference builder shares it.
            value, how = linear.plan(w)
            if isinstance(value, Blocks):
                linear._record(name, value, how)
                return Table("embed_tokens", blocks=value)
        # An untied float table stays float, as the reference keeps it.
        value, how = w.fp32(), f"fp32 from {w.kind}"
    linear._record(name + " (embedding table)", value, how)
    return Table("embed_tokens", floats=value)


def gather(g: GraphBuilder, table: Table, ids: str) -> str:
    """Rows of the embedding table for ``ids`` [B, S] -> [B, S, hidden]."""
    if table.blocks is None:
        assert table.floats is not None
        const = g.const(table.name + ".weight", table.floats)
        if table.floats.dtype != np.float32:
            const = g.op("Cast", [const], to=1)
        return g.op("Gather", [const, ids])
    b = table.blocks
    names = block_consts(g, b, table.name)
    n, k = b.shape
    flat = g.op("Reshape", [names[0], g.const(f"{table.name}.flat", np.array([n, -1], np.int64))])
    inputs = [flat, ids, names[1]] + ([names[2]] if len(names) > 2 else [])
    x = g.op(
        "GatherBlockQuantized",
        inputs,
        domain="com.microsoft",
        bits=b.bits,
        block_size=b.block,
        gather_axis=0,
        quantize_axis=1,
    )
    if b.offsets is None:
        return x
    nb = k // b.block
    off = g.op("Gather", [g.const(table.name + ".offsets", b.offsets), ids])  # [B, S, nb]
    split = g.const(f"{table.name}.block_shape", np.array([0, 0, nb, b.block], np.int64))
    unsq = g.op("Unsqueeze", [off, g.const("axis_last", np.array([-1], np.int64))])
    y = g.op("Add", [g.op("Reshape", [x, split]), unsq])
    return g.op("Reshape", [y, g.const(f"{table.name}.row_shape", np.array([0, 0, k], np.int64))])


def lm_head(g: GraphBuilder, ckpt: Checkpoint, x: str, table: Table, linear: Linear) -> str:
    """Logits from the final hidden state: the untied head like any weight; a tied head reads
    the embedding's own blocks (MatMulNBits on the same initializers) or float table (Gemm,
    transposed: no second copy), or, for an int quant of a float table, its own int blocks."""
    h = ckpt.hyper
    if not h.tied_embeddings:
        return linear(x, ["output.weight"], "lm_head")
    if table.blocks is not None:
        if table.blocks.bits == 8 and linear.accuracy_level < FAST_ACCURACY:
            linear.formats.append(("lm_head (tied)", "fp32 (8-bit blocks need accuracy level 4)"))
            return float_head(g, h, x, g.const("lm_head.weight", table.blocks.dequantize()))
        linear.formats.append(("lm_head (tied)", "the embedding's blocks"))
        return matmul_nbits(g, x, table.blocks, table.name, linear.accuracy_level)
    if QUANTS[linear.quant] is not None:
        return linear(x, ["token_embd.weight"], "lm_head")
    linear.formats.append(("lm_head (tied)", "the embedding table"))
    assert table.floats is not None
    weight = g.const(table.name + ".weight", table.floats)
    if table.floats.dtype != np.float32:
        weight = g.op("Cast", [weight], to=1)
    return float_head(g, h, x, weight, transposed=True)


def float_head(g: GraphBuilder, h: Any, x: str, weight: str, transposed: bool = False) -> str:
    """x [B, S, hidden] @ weight [vocab, hidden].T as one Gemm (transB: no transposed copy)."""
    flat = g.op("Reshape", [x, g.const("flat_shape", np.array([-1, h.hidden], np.int64))])
    logits2d = g.op("Gemm", [flat, weight], transB=1)
    lead = g.op(
        "Slice",
        [
            g.op("Shape", [x]),  # [B, S], or [B, 1] past the last-position switch
            g.const("s0", np.array([0], np.int64)),
            g.const("s2", np.array([2], np.int64)),
        ],
    )
    shape = g.op("Concat", [lead, g.const("vocab_dim", np.array([h.vocab], np.int64))], axis=0)
    return g.op("Reshape", [logits2d, shape])


def block_consts(g: GraphBuilder, blocks: Blocks, name: str) -> list[str]:
    """[B, scales, zero_points?] initializers (2-D scales/zero points, which GatherBlockQuantized
    and MatMulNBits both read); the zero points are left out when all are the default."""
    b, scales, zp = blocks.packed()
    n = blocks.shape[0]
    names = [g.const(name + ".qweight", b), g.const(name + ".scales", scales.reshape(n, -1))]
    if not blocks.symmetric:
        names.append(g.const(name + ".zero_points", zp.reshape(n, -1)))
    return names


def matmul_nbits(g: GraphBuilder, x: str, blocks: Blocks, name: str, accuracy_level: int) -> str:
    n, k = blocks.shape
    consts = block_consts(g, blocks, name)
    y = g.op(
        "MatMulNBits",
        [x, *consts],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=blocks.bits,
        block_size=blocks.block,
        accuracy_level=accuracy_level,
    )
    if blocks.offsets is None:
        return y
    # A per-block offset m: sum over a block of x * m = (block sum of x) * m.
    nb = k // blocks.block
    shape = g.const(
        f"block_shape_{nb}x{blocks.block}", np.array([0, 0, nb, blocks.block], np.int64)
    )
    last = g.const("axis_last", np.array([-1], np.int64))
    sums = g.op("ReduceSum", [g.op("Reshape", [x, shape]), last], keepdims=0)
    offsets = g.const(name + ".offsets_t", np.ascontiguousarray(blocks.offsets.T))
    return g.op("Add", [y, g.op("MatMul", [sums, offsets])])


def rms_norm(g: GraphBuilder, ckpt: Checkpoint, x: str, name: str, onnx_name: str) -> str:
    w = g.const(onnx_name, ckpt.weight(name).fp32())
    return g.op("SimplifiedLayerNormalization", [x, w], epsilon=ckpt.hyper.rms_eps, axis=-1)


def head_rms_norm(
    g: GraphBuilder, ckpt: Checkpoint, x: str, heads: int, name: str, onnx_name: str
) -> str:
    """RMSNorm over each head's values: [B, S, heads*hd] -> [B, S, heads, hd] and back."""
    hd = ckpt.hyper.head_size
    split = g.const(f"heads_{heads}", np.array([0, 0, heads, hd], np.int64))
    y = rms_norm(g, ckpt, g.op("Reshape", [x, split]), name, onnx_name)
    return g.op("Reshape", [y, g.const(f"flat_{heads}", np.array([0, 0, heads * hd], np.int64))])
