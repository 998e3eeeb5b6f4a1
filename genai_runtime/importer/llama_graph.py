"""The llama-family decoder as an ONNX graph, written with ``onnx.helper``: Llama, Mistral,
Qwen2, Qwen3 and Phi-3 differ only in what their checkpoints hold, and the graph follows that.

Layout (the one onnxruntime-genai's builder writes, so both runtimes load it): inputs
``input_ids`` [B, S], ``attention_mask`` [B, T], ``past_key_values.%d.{key,value}``
[B, kv_heads, P, head_size]; outputs ``logits`` [B, S, vocab], ``present.%d.{key,value}``.
Per layer: RMSNorm -> Q/K/V projections (one fused ``attn_qkv``, or three stacked; biases where
the checkpoint has them) -> per-head RMSNorm on Q and K where it has ``attn_q_norm`` ->
GroupQueryAttention (rotary inside; ``local_window_size`` on sliding-window layers) -> output
projection -> residual -> RMSNorm -> SwiGLU MLP (gate and up stacked, or one fused ``ffn_up``
with the gate rows first) -> residual.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .attention import GroupQueryAttention, StaticScatterAttention, rope_tables
from .checkpoint import Checkpoint
from .graph import (
    DATA_FILE,
    IR_VERSION,
    OPSET,
    STATIC_IR_VERSION,
    STATIC_OPSET,
    BuildReport,
    ExternalData,
    GraphBuilder,
    decoder_io,
    last_position_switch,
    save_model,
)
from .linear import Linear, embedding, gather, head_rms_norm, lm_head, rms_norm


def count_weights(ckpt: Checkpoint) -> int:
    """Weight matrices the build converts (for progress bars)."""
    h = ckpt.hyper
    per_layer = sum(
        ckpt.has(f"blk.0.{n}.weight")
        for n in ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up")
    )
    return 1 + (per_layer + 1) * h.layers + (0 if h.tied_embeddings else 1)


def build_decoder(
    ckpt: Checkpoint,
    out_dir: Path,
    *,
    quant: str = "int4",
    accuracy_level: int = 4,
    static_scatter: int | None = None,
    progress: Callable[[str, int], None] | None = None,
    share_buffer: bool = True,  # the same llama graph serves both layouts
) -> BuildReport:
    """Write ``model.onnx`` + ``model.onnx.data`` for ``ckpt`` into ``out_dir``.

    ``static_scatter``: the max_seq_len of a static-scatter cache layout (None: the
    GroupQueryAttention layout). ``progress(tensor_name, total)`` is called once per weight
    matrix converted.
    """
    from onnx import helper

    h = ckpt.hyper
    g = GraphBuilder(ExternalData(out_dir / DATA_FILE))
    linear = Linear(ckpt, g, quant, accuracy_level, count_weights(ckpt), progress)
    cos, sin = rope_tables(g, h, h.rope)
    attention: Any = (
        StaticScatterAttention(g, h, cos, sin, static_scatter)
        if static_scatter
        else GroupQueryAttention(g, h, cos, sin)
    )
    table = embedding(linear)
    x = gather(g, table, "input_ids")
    q_dim, kv_dim = h.heads * h.head_size, h.kv_heads * h.head_size
    qkv_sizes = np.array([q_dim, kv_dim, kv_dim], np.int64)
    split_ffn = g.const("split_ffn", np.array([h.intermediate, h.intermediate], np.int64))
    inputs, outputs = decoder_io(h.vocab)
    inputs += attention.inputs()
    for i in range(h.layers):
        p, o = f"blk.{i}.", f"layers.{i}."
        attn_in = rms_norm(g, ckpt, x, p + "attn_norm.weight", o + "input_layernorm.weight")
        if ckpt.has(p + "attn_qkv.weight"):
            names, biases = [p + "attn_qkv.weight"], [p + "attn_qkv.bias"]
        else:
            names = [p + f"attn_{t}.weight" for t in "qkv"]
            biases = [p + f"attn_{t}.bias" for t in "qkv"]
        qkv: Any = linear(attn_in, names, o + "attn.qkv_proj", biases)
        if ckpt.has(p + "attn_q_norm.weight"):
            q, k, v = g.op("Split", [qkv, g.const("split_qkv", qkv_sizes)], n_out=3, axis=-1)
            q = head_rms_norm(g, ckpt, q, h.heads, p + "attn_q_norm.weight", o + "attn.q_norm")
            k = head_rms_norm(g, ckpt, k, h.kv_heads, p + "attn_k_norm.weight", o + "attn.k_norm")
            qkv = (q, k, v)
        window = h.sliding_window if i in h.local_layers else -1
        attn = attention.layer(i, qkv, inputs, outputs, local_window_size=window)
        x = g.op("Add", [x, linear(attn, [p + "attn_output.weight"], o + "attn.o_proj")])
        mlp_in = rms_norm(g, ckpt, x, p + "ffn_norm.weight", o + "post_attention_layernorm.weight")
        if ckpt.has(p + "ffn_gate.weight"):
            names = [p + "ffn_gate.weight", p + "ffn_up.weight"]
        else:  # fused gate_up, gate rows first
            names = [p + "ffn_up.weight"]
        gate_up = linear(mlp_in, names, o + "mlp.gate_up")
        gate, up = g.op("Split", [gate_up, split_ffn], n_out=2, axis=-1)
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
        x = g.op("Add", [x, linear(act, [p + "ffn_down.weight"], o + "mlp.down_proj")])
    x = rms_norm(g, ckpt, x, "output_norm.weight", "final_norm.weight")

    if not static_scatter:  # fixed-shape passes read every position's logits
        x = last_position_switch(g, inputs, x)
    logits = lm_head(g, ckpt, x, table, linear)
    g.nodes.append(helper.make_node("Identity", [logits], ["logits"], name="/lm_head/output"))
    if static_scatter:
        save_model(g, inputs, outputs, out_dir, STATIC_OPSET, STATIC_IR_VERSION)
    else:
        save_model(g, inputs, outputs, out_dir, OPSET, IR_VERSION)
    return linear.report()
