"""The Gemma 3 decoder as an ONNX graph, written with ``onnx.helper``.

Same inputs, outputs and KV layout as the llama graph (``graph.py``), so both runtimes load it.
What differs, per layer: RMSNorm -> Q/K/V -> per-head RMSNorm on Q and K -> GroupQueryAttention
(rotary inside; local layers attend through a sliding window with their own rope base) -> output
projection -> RMSNorm -> residual -> RMSNorm -> GELU-tanh gated MLP -> RMSNorm -> residual.
The token embedding is scaled by sqrt(hidden); the lm_head is the (unscaled) embedding table.

Gemma's RMSNorm multiplies by ``1 + w``; llama.cpp's converter stores ``w + 1`` in the GGUF (and
transformers' GGUF loader subtracts the 1 again), so the stored weights are used as they are (a
Hugging Face folder stores ``w``: its reader adds the 1).
Local layers use GroupQueryAttention's ``local_window_size`` with ``sliding_window_cache``, as the
reference builder writes for CPU, and ``genai_config.json`` lists them under
``decoder.sliding_window`` so both runtimes size those layers' caches to the window.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .attention import GroupQueryAttention, rope_tables
from .checkpoint import Checkpoint
from .graph import (
    DATA_FILE,
    IR_VERSION,
    OPSET,
    BuildReport,
    ExternalData,
    GraphBuilder,
    decoder_io,
    last_position_switch,
    save_model,
)
from .linear import Linear, embedding, gather, head_rms_norm, lm_head, rms_norm


def build_gemma3_decoder(
    ckpt: Checkpoint,
    out_dir: Path,
    *,
    quant: str = "int4",
    accuracy_level: int = 4,
    progress: Callable[[str, int], None] | None = None,
    share_buffer: bool = True,
) -> BuildReport:
    """Write ``model.onnx`` + ``model.onnx.data`` for a Gemma 3 checkpoint into ``out_dir``.

    With ``share_buffer`` the local layers keep window-sized caches (``sliding_window_cache``);
    without it (``--cache concat``) every cache grows and the window is only a mask, since the
    kernel's windowed cache needs a preallocated buffer."""
    from onnx import helper

    h = ckpt.hyper
    g = GraphBuilder(ExternalData(out_dir / DATA_FILE))
    linear = Linear(ckpt, g, quant, accuracy_level, 1 + 7 * h.layers, progress)

    def norm(x: str, name: str, onnx_name: str) -> str:
        return rms_norm(g, ckpt, x, name, onnx_name)

    # Global layers: the checkpoint's rope; local layers: their own base, unscaled.
    local_rope = dataclasses.replace(h.rope, base=h.local_rope_base, linear=1.0, factors=())
    caches = {
        False: rope_tables(g, h, h.rope, "_global"),
        True: rope_tables(g, h, local_rope, "_local"),
    }
    attention = GroupQueryAttention(g, h, *caches[False])

    table = embedding(linear)
    scale = g.const("embed_scale", np.array(np.sqrt(h.hidden), np.float32))
    x = g.op("Mul", [gather(g, table, "input_ids"), scale])

    q_dim, kv_dim = h.heads * h.head_size, h.kv_heads * h.head_size
    split_qkv = g.const("split_qkv", np.array([q_dim, kv_dim, kv_dim], np.int64))
    split_ffn = g.const("split_ffn", np.array([h.intermediate, h.intermediate], np.int64))
    inputs, outputs = decoder_io(h.vocab)
    inputs += attention.inputs()
    for i in range(h.layers):
        p, o = f"blk.{i}.", f"layers.{i}."
        local = i in h.local_layers
        attn_in = norm(x, p + "attn_norm.weight", o + "input_layernorm.weight")
        qkv = linear(
            attn_in,
            [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"],
            o + "attn.qkv_proj",
        )
        q, k, v = g.op("Split", [qkv, split_qkv], n_out=3, axis=-1)
        q = head_rms_norm(g, ckpt, q, h.heads, p + "attn_q_norm.weight", o + "attn.q_norm")
        k = head_rms_norm(g, ckpt, k, h.kv_heads, p + "attn_k_norm.weight", o + "attn.k_norm")
        attrs: dict[str, Any] = {"local_window_size": h.sliding_window if local else -1}
        if local and share_buffer:
            # Window-sized past/present buffers for this layer; the kernel evicts inside them.
            attrs["sliding_window_cache"] = 1
        if h.attn_softcap:
            attrs["softcap"] = h.attn_softcap
        # Scaled by query_pre_attn_scalar^-0.5 (Hyper.query_scale); a GGUF does not store it,
        # and llama.cpp uses 1/sqrt(head_size), equal for every size but 27B.
        attn = attention.layer(i, (q, k, v), inputs, outputs, rope=caches[local], **attrs)
        y = linear(attn, [p + "attn_output.weight"], o + "attn.o_proj")
        x = g.op(
            "Add",
            [x, norm(y, p + "post_attention_norm.weight", o + "post_attention_layernorm.weight")],
        )
        mlp_in = norm(x, p + "ffn_norm.weight", o + "pre_feedforward_layernorm.weight")
        gate_up = linear(mlp_in, [p + "ffn_gate.weight", p + "ffn_up.weight"], o + "mlp.gate_up")
        gate, up = g.op("Split", [gate_up, split_ffn], n_out=2, axis=-1)
        act = g.op("Mul", [g.op("Gelu", [gate], approximate="tanh"), up])
        y = linear(act, [p + "ffn_down.weight"], o + "mlp.down_proj")
        x = g.op(
            "Add", [x, norm(y, p + "post_ffw_norm.weight", o + "post_feedforward_layernorm.weight")]
        )
    x = norm(x, "output_norm.weight", "final_norm.weight")

    x = last_position_switch(g, inputs, x)
    logits = lm_head(g, ckpt, x, table, linear)
    if h.final_softcap:
        cap = g.const("final_softcap", np.array(h.final_softcap, np.float32))
        logits = g.op("Mul", [g.op("Tanh", [g.op("Div", [logits, cap])]), cap])
    g.nodes.append(helper.make_node("Identity", [logits], ["logits"], name="/lm_head/output"))
    save_model(g, inputs, outputs, out_dir, OPSET, IR_VERSION)
    return linear.report()


def genai_config_extras(model: Checkpoint, share_buffer: bool = True) -> dict[str, Any]:
    """What ``genai_config.json`` needs beyond the llama form: the family's model type and, for
    the Gemma 3 block's window-sized caches, the sliding window's layers (the reference
    builder's CPU form, so onnxruntime-genai sizes those caches as ``sliding_window_cache``
    expects). The llama block keeps full caches and masks the window in the kernel."""
    layers = list(model.hyper.local_layers)
    decoder: dict[str, Any] = {}
    if layers and share_buffer and model.family.block == "gemma3":
        decoder["sliding_window"] = {
            "window_size": model.hyper.sliding_window,
            "slide_key_value_cache": False,
            "slide_inputs": False,
            "layers": layers,
            "cache_slack": 0,
        }
    top = {"type": model.family.genai_type} if model.family.genai_type else {}
    return {"model": top, "decoder": decoder}
