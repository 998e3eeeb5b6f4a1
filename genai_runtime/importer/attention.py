"""Attention for the decoder graphs, and the rotary tables it reads.

``GroupQueryAttention`` (com.microsoft): rotary inside, past/present [B, kv_heads, T, D] (one
buffer when the runtime shares it), lengths from ``attention_mask``; sliding-window layers through
its ``local_window_size``. The static-scatter layout swaps it for standard opset-24 ops:
RotaryEmbedding at ``position_ids``, TensorScatter of the new rows into per-layer
``key_cache.%d`` / ``value_cache.%d`` [B, max_seq_len, kv_heads * head_size] at
``write_indices``, and Attention reading ``nonpad_kv_seqlen`` valid rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import UnsupportedError
from .checkpoint import Hyper, Rope, inverse_frequencies
from .graph import GraphBuilder


def rope_tables(g: GraphBuilder, h: Hyper, rope: Rope, tag: str = "") -> tuple[str, str]:
    """(cos, sin) [positions, rope.dim/2] for GroupQueryAttention. With longrope's long factors,
    an ``If`` on the total length picks the long tables past ``rope.original_context`` (the
    reference builder's form); tokens already cached keep the rotation they got."""
    if not rope.long_factors:
        return _table(g, rope, h.context_length, False, tag)
    from onnx import TensorProto, helper

    short = _table(g, rope, rope.original_context, False, tag + "_small")
    long = _table(g, rope, h.context_length, True, tag + "_large")
    shape = g.op("Shape", ["attention_mask"])
    total = g.op("Gather", [shape, g.const("idx1", np.array(1))])
    cond = g.op("Greater", [total, g.const("original_context", np.array(rope.original_context))])

    def branch(name: str, tables: tuple[str, str]) -> Any:
        outs = [f"{name}/{t}" for t in ("cos", "sin")]
        nodes = [helper.make_node("Identity", [t], [o]) for t, o in zip(tables, outs)]
        values = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs]
        return helper.make_graph(nodes, name, [], values)

    cos, sin = g.op(
        "If",
        [cond],
        n_out=2,
        then_branch=branch("long_rope" + tag, long),
        else_branch=branch("short_rope" + tag, short),
    )
    return cos, sin


def _table(g: GraphBuilder, rope: Rope, positions: int, long: bool, tag: str) -> tuple[str, str]:
    """cos/sin tables computed by the graph from the positions and the inverse frequencies, in
    fp32 as transformers computes them; onnxruntime folds them into constants at load, so the
    model file holds only ``inv_freq`` (Gemma 3's 32k x 128 tables would be 67 MB)."""
    inv = inverse_frequencies(rope, long)[None, :].astype(np.float32)
    f32 = np.float32
    pos = g.op(
        "Range",
        [
            g.const("zero_f32", np.array(0, f32)),
            g.const(f"positions_{positions}", np.array(positions, f32)),
            g.const("one_f32", np.array(1, f32)),
        ],
    )
    col = g.op("Unsqueeze", [pos, g.const("axis_1", np.array([1], np.int64))])
    angles = g.op("Mul", [col, g.const(f"inv_freq{tag}", inv)])
    cos, sin = g.op("Cos", [angles]), g.op("Sin", [angles])
    if rope.attn_factor != 1.0:
        scale = g.const(f"rope_scale{tag}", np.array(rope.attn_factor, f32))
        cos, sin = g.op("Mul", [cos, scale]), g.op("Mul", [sin, scale])
    return cos, sin


class GroupQueryAttention:
    """com.microsoft GroupQueryAttention: rotary inside, past/present [B, kv_heads, T, D]
    (one buffer when the runtime shares it), lengths from ``attention_mask``."""

    def __init__(self, g: GraphBuilder, h: Hyper, cos: str, sin: str):
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
        scale=float(h.query_scale or h.head_size**-0.5),
        do_rotary=1,
        rotary_interleaved=0,
        **attrs,
    )


class StaticScatterAttention:
    """Standard opset-24 ops over fixed [B, max_seq_len, kv_hidden] caches the graph updates in
    place: RotaryEmbedding, TensorScatter at ``write_indices``, Attention with
    ``nonpad_kv_seqlen``."""

    def __init__(self, g: GraphBuilder, h: Hyper, cos: str, sin: str, max_seq_len: int):
        if h.rope.long_factors or h.local_layers or h.rope.dim != h.head_size:
            raise UnsupportedError(
                "--cache static-scatter builds full-attention, full-rotary llama graphs; this "
                "model has longrope, sliding-window layers or partial rotary (use share-buffer)"
            )
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

    def layer(
        self, i: int, qkv: str | tuple[str, str, str], inputs: list, outputs: list, **_: Any
    ) -> str:
        from onnx import TensorProto, helper

        g, h = self.g, self.h
        if isinstance(qkv, str):
            q, k, v = g.op("Split", [qkv, self.split], n_out=3, axis=-1)
        else:
            q, k, v = qkv
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
