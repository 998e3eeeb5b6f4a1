"""The llama-family decoder as an ONNX graph, written with ``onnx.helper``.

Layout (the one onnxruntime-genai's builder writes, so both runtimes load it): inputs
``input_ids`` [B, S], ``attention_mask`` [B, T], ``past_key_values.%d.{key,value}``
[B, kv_heads, P, head_size]; outputs ``logits`` [B, S, vocab], ``present.%d.{key,value}``.
Per layer: RMSNorm -> Q/K/V projections -> GroupQueryAttention (rotary inside, from cos/sin
tables built from the GGUF's rope parameters) -> output projection -> residual -> RMSNorm ->
SwiGLU MLP -> residual.

The static-scatter layout (``cache="static-scatter"``) swaps the attention for standard ops:
RotaryEmbedding on q and k at ``position_ids``, TensorScatter of the new rows into per-layer
``key_cache.%d`` / ``value_cache.%d`` [B, max_seq_len, kv_heads * head_size] at
``write_indices``, and opset-24 Attention reading ``nonpad_kv_seqlen`` valid rows; the updated
caches come out as ``updated_key_cache.%d`` / ``updated_value_cache.%d``.

Weights stream one by one into ``model.onnx.data`` so peak memory stays near one tensor, not the
whole model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .gguf_file import GGUFModel, rope_cos_sin
from .weights import Blocks, check_type, dequantize, to_blocks, unpermute_rows

DTYPES = ("auto", "fp32")
IR_VERSION = 10  # onnxruntime 1.31 refuses the IR 14 that onnx 1.23 stamps by default
OPSET = 21
STATIC_OPSET, STATIC_IR_VERSION = 24, 11  # TensorScatter and Attention's nonpad_kv_seqlen
DATA_FILE = "model.onnx.data"
_ALIGN = 64


@dataclass
class ExternalData:
    """Appends initializers to one external-data file as they are made (no handle kept open,
    so a failed build leaves nothing to close)."""

    path: Path
    offset: int = 0

    def __post_init__(self) -> None:
        self.path.write_bytes(b"")

    def tensor(self, name: str, array: np.ndarray) -> Any:
        from onnx import TensorProto, helper

        array = np.ascontiguousarray(array)
        pad = (-self.offset) % _ALIGN
        # Written from the array's own buffer: no bytes copy of a large table.
        raw = memoryview(array.reshape(-1)).cast("B")
        with open(self.path, "ab") as f:
            f.write(b"\0" * pad)
            f.write(raw)
        self.offset += pad
        proto = TensorProto()
        proto.name = name
        proto.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        proto.dims.extend(array.shape)
        proto.data_location = TensorProto.EXTERNAL
        for key, value in (
            ("location", self.path.name),
            ("offset", str(self.offset)),
            ("length", str(len(raw))),
        ):
            entry = proto.external_data.add()
            entry.key, entry.value = key, value
        self.offset += len(raw)
        return proto


@dataclass
class GraphBuilder:
    """Collects nodes and initializers; names are unique by construction (prefix + counter)."""

    data: ExternalData
    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    _count: int = 0
    _consts: set = field(default_factory=set)

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, domain: str = "", **attrs):
        from onnx import helper

        self._count += 1
        name = f"/{op_type}_{self._count}"
        outs = [f"{name}/output_{i}" for i in range(n_out)]
        node = helper.make_node(op_type, inputs, outs, name=name, domain=domain, **attrs)
        self.nodes.append(node)
        return outs[0] if n_out == 1 else outs

    def const(self, name: str, array: np.ndarray) -> str:
        from onnx import numpy_helper

        if name in self._consts:
            return name
        self._consts.add(name)
        if array.nbytes >= 1024:
            self.initializers.append(self.data.tensor(name, array))
        else:
            self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name


@dataclass(frozen=True)
class BuildReport:
    """What the build did with each weight: kept as MatMulNBits blocks, or dequantised."""

    nbits: tuple[str, ...]
    dequantised: tuple[str, ...]


def build_decoder(
    model: GGUFModel,
    out_dir: Path,
    *,
    dtype: str = "auto",
    accuracy_level: int = 0,
    static_scatter: int | None = None,
    progress: Callable[[str, int], None] | None = None,
    share_buffer: bool = True,  # the same llama graph serves both layouts
) -> BuildReport:
    """Write ``model.onnx`` + ``model.onnx.data`` for ``model`` into ``out_dir``.

    ``static_scatter``: the max_seq_len of a static-scatter cache layout (None: the
    GroupQueryAttention layout). ``progress(tensor_name, total)`` is called once per weight
    matrix converted.
    """
    from onnx import helper

    h = model.hyper
    for t in model.tensors.values():
        check_type(t, str(model.path))
    g = GraphBuilder(ExternalData(out_dir / DATA_FILE))
    n_weights = 1 + 7 * h.layers + (0 if h.tied_embeddings else 1)
    linear = Linear(model, g, dtype, accuracy_level, n_weights, progress)

    def norm(x: str, gguf_name: str, onnx_name: str) -> str:
        return rms_norm(g, model, x, gguf_name, onnx_name)

    cos, sin = rope_cos_sin(h, h.context_length)
    cos_name, sin_name = g.const("cos_cache", cos), g.const("sin_cache", sin)
    attention = (
        _StaticScatterAttention(g, h, cos_name, sin_name, static_scatter)
        if static_scatter
        else GroupQueryAttention(g, h, cos_name, sin_name)
    )

    embed_name = linear.embedding()
    x = g.op("Gather", [embed_name, "input_ids"])
    split_ffn = g.const("split_ffn", np.array([h.intermediate, h.intermediate], np.int64))

    q_rows = unpermute_rows(h.heads, h.heads * h.head_size) if model.family.unpermute_qk else None
    k_rows = (
        unpermute_rows(h.kv_heads, h.kv_heads * h.head_size) if model.family.unpermute_qk else None
    )
    inputs, outputs = decoder_io(h.vocab)
    inputs += attention.inputs()
    for i in range(h.layers):
        p, o = f"blk.{i}.", f"layers.{i}."
        attn_in = norm(x, p + "attn_norm.weight", o + "input_layernorm.weight")
        qkv = linear(
            attn_in,
            [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"],
            o + "attn.qkv_proj",
            rows=[q_rows, k_rows, None],
        )
        attn = attention.layer(i, qkv, inputs, outputs)
        x = g.op("Add", [x, linear(attn, [p + "attn_output.weight"], o + "attn.o_proj")])
        mlp_in = norm(x, p + "ffn_norm.weight", o + "post_attention_layernorm.weight")
        gate_up = linear(mlp_in, [p + "ffn_gate.weight", p + "ffn_up.weight"], o + "mlp.gate_up")
        gate, up = g.op("Split", [gate_up, split_ffn], n_out=2, axis=-1)
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
        x = g.op("Add", [x, linear(act, [p + "ffn_down.weight"], o + "mlp.down_proj")])
    x = norm(x, "output_norm.weight", "final_norm.weight")

    logits = lm_head(g, model, x, embed_name, linear)
    g.nodes.append(helper.make_node("Identity", [logits], ["logits"], name="/lm_head/output"))
    if static_scatter:
        save_model(g, inputs, outputs, out_dir, STATIC_OPSET, STATIC_IR_VERSION)
    else:
        save_model(g, inputs, outputs, out_dir, OPSET, IR_VERSION)
    return linear.report()


@dataclass
class Linear:
    """x @ W.T for GGUF weights W [out, in] stacked along out (one MatMul for q/k/v or
    gate/up), each with an optional row order: MatMulNBits when every part's blocks map,
    else an fp32 MatMul. Records which weights went which way."""

    model: GGUFModel
    g: GraphBuilder
    dtype: str
    accuracy_level: int
    total: int  # weight matrices in the model, for ``progress``
    progress: Callable[[str, int], None] | None
    nbits: list[str] = field(default_factory=list)
    dequantised: list[str] = field(default_factory=list)

    def __call__(
        self,
        x: str,
        names: list[str],
        onnx_name: str,
        rows: list[np.ndarray | None] | None = None,
    ) -> str:
        rows = rows or [None] * len(names)
        tensors = [self.model.tensor(n) for n in names]
        for n in names:
            if self.progress:
                self.progress(n, self.total)
        blocks = [to_blocks(t) if self.dtype == "auto" else None for t in tensors]
        if all(b is not None for b in blocks):
            ordered = [b if r is None else b.rows(r) for b, r in zip(blocks, rows)]
            self.nbits.extend(names)
            return _matmul_nbits(self.g, x, Blocks.stack(ordered), onnx_name, self.accuracy_level)
        ws = []
        for t, r in zip(tensors, rows):
            w = dequantize(t)
            ws.append(w if r is None else w[r])
        self.dequantised.extend(names)
        w = np.concatenate(ws, axis=0) if len(ws) > 1 else ws[0]
        return self.g.op(
            "MatMul", [x, self.g.const(onnx_name + ".weight", np.ascontiguousarray(w.T))]
        )

    def embedding(self) -> str:
        """The token embedding table as an fp32 initializer (read in row blocks)."""
        if self.progress:
            self.progress("token_embd.weight", self.total)
        table = dequantize_rows(self.model.tensor("token_embd.weight"))
        self.dequantised.append("token_embd.weight (embedding table)")
        return self.g.const("embed_tokens.weight", table)

    def report(self) -> BuildReport:
        return BuildReport(tuple(self.nbits), tuple(self.dequantised))


def dequantize_rows(t: Any, chunk: int = 16384) -> np.ndarray:
    """``dequantize`` for a large table, a block of rows at a time: the dequantiser's fp32
    temporaries stay one block big instead of table-sized (262k x 640 for Gemma 3)."""
    n_rows = int(np.prod(t.shape[1:]))
    out = np.empty((n_rows, int(t.shape[0])), np.float32)
    for start in range(0, n_rows, chunk):
        part = dataclasses.replace(t, data=t.data[start : start + chunk])
        out[start : start + chunk] = dequantize(part).reshape(-1, out.shape[1])
    return out


def rms_norm(g: GraphBuilder, model: GGUFModel, x: str, gguf_name: str, onnx_name: str) -> str:
    w = g.const(onnx_name, dequantize(model.tensor(gguf_name)))
    return g.op("SimplifiedLayerNormalization", [x, w], epsilon=model.hyper.rms_eps, axis=-1)


def decoder_io(vocab: int) -> tuple[list, list]:
    """The inputs and outputs every decoder graph starts from: ``input_ids``, ``logits``."""
    from onnx import TensorProto, helper

    ids = ["batch_size", "seq_len"]
    logits = ["batch_size", "seq_len", vocab]
    return (
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ids)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, logits)],
    )


def lm_head(g: GraphBuilder, model: GGUFModel, x: str, embed_name: str, linear: Linear) -> str:
    """Logits from the final hidden state: MatMulNBits when the head's blocks map, else the
    tied embedding table (read transposed by Gemm: no second copy on disk), else fp32."""
    h = model.hyper
    head = "token_embd.weight" if h.tied_embeddings else "output.weight"
    blocks = to_blocks(model.tensor(head)) if linear.dtype == "auto" else None
    if blocks is not None:
        linear.nbits.append(head)
        return _matmul_nbits(g, x, blocks, "lm_head", linear.accuracy_level)
    if not h.tied_embeddings:
        return linear(x, [head], "lm_head")
    linear.dequantised.append("lm_head (tied: the embedding table)")
    flat = g.op("Reshape", [x, g.const("flat_shape", np.array([-1, h.hidden], np.int64))])
    logits2d = g.op("Gemm", [flat, embed_name], transB=1)
    lead = g.op(
        "Slice",
        [
            g.op("Shape", ["input_ids"]),
            g.const("s0", np.array([0], np.int64)),
            g.const("s2", np.array([2], np.int64)),
        ],
    )
    shape = g.op("Concat", [lead, g.const("vocab_dim", np.array([h.vocab], np.int64))], axis=0)
    return g.op("Reshape", [logits2d, shape])


def save_model(
    g: GraphBuilder, inputs: list, outputs: list, out_dir: Path, opset: int, ir_version: int
) -> None:
    from onnx import helper

    graph = helper.make_graph(g.nodes, "decoder", inputs, outputs, g.initializers)
    onnx_model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)],
        producer_name="genai_runtime.importer",
    )
    onnx_model.ir_version = ir_version
    (out_dir / "model.onnx").write_bytes(onnx_model.SerializeToString())


class GroupQueryAttention:
    """com.microsoft GroupQueryAttention: rotary inside, past/present [B, kv_heads, T, D]
    (one buffer when the runtime shares it), lengths from ``attention_mask``."""

    def __init__(self, g: GraphBuilder, h: Any, cos: str, sin: str):
        self.g, self.h, self.cos, self.sin = g, h, cos, sin
        one = g.const("one_i64", np.array([1], np.int64))
        lengths = g.op("ReduceSum", ["attention_mask", one], keepdims=0)
        self.seqlens = g.op("Cast", [g.op("Sub", [lengths, one])], to=6)
        shape = g.op("Shape", ["attention_mask"])
        self.total = g.op("Cast", [g.op("Gather", [shape, g.const("idx1", np.array(1))])], to=6)

    def inputs(self) -> list:
        from onnx import TensorProto, helper

        mask = ["batch_size", "total_seq_len"]
        return [helper.make_tensor_value_info("attention_mask", TensorProto.INT64, mask)]

    def layer(
        self,
        i: int,
        qkv: str | tuple[str, str, str],
        inputs: list,
        outputs: list,
        rope: tuple[str, str] | None = None,
        **attrs: Any,
    ) -> str:
        """Layer ``i``'s attention over ``qkv`` (one packed tensor, or q, k, v), rotary from
        ``rope`` (cos, sin) or the model's tables; ``attrs`` add to the node's attributes."""
        from onnx import TensorProto, helper

        h = self.h
        q, k, v = (qkv, "", "") if isinstance(qkv, str) else qkv
        cos, sin = rope or (self.cos, self.sin)
        attrs.setdefault("local_window_size", -1)
        past_k, past_v = f"past_key_values.{i}.key", f"past_key_values.{i}.value"
        present_k, present_v = f"present.{i}.key", f"present.{i}.value"
        past_shape = ["batch_size", h.kv_heads, "past_seq_len", h.head_size]
        present_shape = ["batch_size", h.kv_heads, "total_seq_len", h.head_size]
        for name in (past_k, past_v):
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, past_shape))
        for name in (present_k, present_v):
            outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, present_shape))
        attn = f"/layers.{i}/attn/output"
        self.g.nodes.append(
            group_query_attention(
                i,
                [q, k, v, past_k, past_v, self.seqlens, self.total, cos, sin],
                [attn, present_k, present_v],
                h,
                **attrs,
            )
        )
        return attn


def group_query_attention(i: int, inputs: list[str], outputs: list[str], h: Any, **attrs):
    """Layer ``i``'s com.microsoft GroupQueryAttention node, rotary inside (half-split)."""
    from onnx import helper

    return helper.make_node(
        "GroupQueryAttention",
        inputs,
        outputs,
        name=f"/layers.{i}/attn/GroupQueryAttention",
        domain="com.microsoft",
        num_heads=h.heads,
        kv_num_heads=h.kv_heads,
        scale=float(h.head_size**-0.5),
        do_rotary=1,
        rotary_interleaved=0,
        **attrs,
    )


class _StaticScatterAttention:
    """Standard opset-24 ops over fixed [B, max_seq_len, kv_hidden] caches the graph updates in
    place: RotaryEmbedding, TensorScatter at ``write_indices``, Attention with
    ``nonpad_kv_seqlen``."""

    def __init__(self, g: GraphBuilder, h: Any, cos: str, sin: str, max_seq_len: int):
        self.g, self.h, self.max_seq_len = g, h, max_seq_len
        self.cos = g.op("Gather", [cos, "position_ids"])  # [B, S, D/2]
        self.sin = g.op("Gather", [sin, "position_ids"])
        q, kv = h.heads * h.head_size, h.kv_heads * h.head_size
        self.split = g.const("split_qkv", np.array([q, kv, kv], np.int64))

    def inputs(self) -> list:
        from onnx import TensorProto, helper

        ints = TensorProto.INT64
        return [
            helper.make_tensor_value_info("position_ids", ints, ["batch_size", "seq_len"]),
            helper.make_tensor_value_info("write_indices", ints, ["batch_size"]),
            helper.make_tensor_value_info("nonpad_kv_seqlen", ints, ["batch_size"]),
        ]

    def layer(self, i: int, qkv: str, inputs: list, outputs: list) -> str:
        from onnx import TensorProto, helper

        g, h = self.g, self.h
        q, k, v = g.op("Split", [qkv, self.split], n_out=3, axis=-1)
        q = g.op("RotaryEmbedding", [q, self.cos, self.sin], num_heads=h.heads)
        k = g.op("RotaryEmbedding", [k, self.cos, self.sin], num_heads=h.kv_heads)
        shape = ["batch_size", self.max_seq_len, h.kv_heads * h.head_size]
        updated = []
        for kind, rows in (("key", k), ("value", v)):
            past, present = f"{kind}_cache.{i}", f"updated_{kind}_cache.{i}"
            inputs.append(helper.make_tensor_value_info(past, TensorProto.FLOAT, shape))
            outputs.append(helper.make_tensor_value_info(present, TensorProto.FLOAT, shape))
            g.nodes.append(
                helper.make_node(
                    "TensorScatter",
                    [past, rows, "write_indices"],
                    [present],
                    name=f"/layers.{i}/attn/{kind}_scatter",
                    axis=1,
                )
            )
            updated.append(present)
        attn = f"/layers.{i}/attn/output"
        g.nodes.append(
            helper.make_node(
                "Attention",
                [q, *updated, "", "", "", "nonpad_kv_seqlen"],
                [attn],
                name=f"/layers.{i}/attn/Attention",
                q_num_heads=h.heads,
                kv_num_heads=h.kv_heads,
                scale=float(h.head_size**-0.5),
                is_causal=1,
            )
        )
        return attn


def _matmul_nbits(g: GraphBuilder, x: str, blocks: Blocks, name: str, accuracy_level: int) -> str:
    n, k = blocks.shape
    nb, bs = blocks.codes.shape[1:]
    b, scales, zp = blocks.packed()
    y = g.op(
        "MatMulNBits",
        [
            x,
            g.const(name + ".qweight", b),
            g.const(name + ".scales", scales),
            g.const(name + ".zero_points", zp),
        ],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=blocks.bits,
        block_size=bs,
        accuracy_level=accuracy_level,
    )
    if blocks.offsets is None:
        return y
    # Q4_1's per-block offset m: sum over a block of x * m = (block sum of x) * m.
    shape = g.const(name + ".block_shape", np.array([0, 0, nb, bs], np.int64))
    last = g.const("axis_last", np.array([-1], np.int64))
    sums = g.op("ReduceSum", [g.op("Reshape", [x, shape]), last], keepdims=0)
    offsets = g.const(name + ".offsets", np.ascontiguousarray(blocks.offsets.T))
    return g.op("Add", [y, g.op("MatMul", [sums, offsets])])
