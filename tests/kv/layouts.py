"""One tiny decoder, emitted in every KV-cache layout the runtime handles, plus its NumPy forward.

The model: token + learned position embeddings, ``LAYERS`` attention-only residual blocks with
grouped-query attention (``HEADS`` query heads over ``KV_HEADS`` key/value heads), a linear head.
Every layout computes exactly this math; only how the cache enters and leaves the graph differs:

- ``concat``: ``past_key_values.%d.*`` [B, Hkv, P, D] in, past+new out, ``attention_mask`` [B, T].
- ``share-buffer``: com.microsoft GroupQueryAttention, past and present one buffer.
- ``static-scatter``: ``key_cache.%d`` [B, CAPACITY, Hkv*D], TensorScatter at ``write_indices``,
  Attention-24 reading ``nonpad_kv_seqlen`` valid rows.
- ``graph-scattered``: [B, Hkv, CAPACITY, D] in and out, ScatterElements at ``position_ids``.
- fixed-shape (``static-index-copy``, ``static-fifo``): every shape fixed, ``CHUNK`` tokens per
  pass; past [B, Hkv, ctx, D] in, only the chunk's K/V out; attention over past + chunk under an
  ``attention_mask`` [B, ctx + CHUNK] (left-aligned past slots for index-copy, right-aligned for
  FIFO) and causality inside the chunk. Index-copy reads positions from ``cache_position``.

A ``window`` makes the listed layers attend only to the last ``window`` positions (sliding window;
GroupQueryAttention's ``local_window_size``, an explicit band mask elsewhere).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 24  # TensorScatter and Attention with nonpad_kv_seqlen
IR_VERSION = 11
VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD = 32, 16, 4, 2, 8  # GQA wants head_size % 8 == 0
LAYERS = 2
MAX_POS = 64
CAPACITY = 24  # the static-scatter graph's max_seq_len
PAD, EOS = 0, VOCAB - 1
CHUNK = 4  # the fixed-shape graphs' fixed number of new tokens per pass
LAYOUTS = (
    "concat",
    "share-buffer",
    "static-scatter",
    "graph-scattered",
    "static-index-copy",
    "static-fifo",
)
FIXED_SHAPE = ("static-index-copy", "static-fifo")


def weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    out = {"emb": w(VOCAB, HIDDEN), "pos": w(MAX_POS, HIDDEN, scale=2.0)}
    for i in range(LAYERS):
        out[f"wq{i}"] = w(HIDDEN, HEADS * HEAD, scale=HIDDEN**-0.5)
        out[f"wk{i}"] = w(HIDDEN, KV_HEADS * HEAD, scale=HIDDEN**-0.5)
        out[f"wv{i}"] = w(HIDDEN, KV_HEADS * HEAD, scale=HIDDEN**-0.5)
        out[f"wo{i}"] = w(HEADS * HEAD, HIDDEN, scale=(HEADS * HEAD) ** -0.5)
    out["lm"] = w(HIDDEN, VOCAB, scale=HIDDEN**-0.5)
    bias = np.zeros(VOCAB, np.float32)
    bias[EOS] = -100.0  # greedy never ends early: runs stay comparable step by step
    out["lm_bias"] = bias
    return out


# -- NumPy reference -----------------------------------------------------------------------


def reference_logits(
    tokens: Sequence[int],
    w: dict[str, np.ndarray],
    window: int | None = None,
    window_layers: Sequence[int] = (),
) -> np.ndarray:
    """Logits [L, V] at every position of one unpadded sequence, recomputed with no cache."""
    n = len(tokens)
    x = w["emb"][np.asarray(tokens)] + w["pos"][np.arange(n)]
    rows, cols = np.arange(n)[:, None], np.arange(n)[None, :]
    for i in range(LAYERS):
        allowed = cols <= rows
        if window and (not window_layers or i in window_layers):
            allowed &= rows - cols < window
        q = (x @ w[f"wq{i}"]).reshape(n, HEADS, HEAD).transpose(1, 0, 2)
        k = (x @ w[f"wk{i}"]).reshape(n, KV_HEADS, HEAD).transpose(1, 0, 2)
        v = (x @ w[f"wv{i}"]).reshape(n, KV_HEADS, HEAD).transpose(1, 0, 2)
        group = HEADS // KV_HEADS
        k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
        scores = q @ k.transpose(0, 2, 1) * HEAD**-0.5
        scores = np.where(allowed, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        o = (probs @ v).transpose(1, 0, 2).reshape(n, HEADS * HEAD)
        x = x + o @ w[f"wo{i}"]
    return x @ w["lm"] + w["lm_bias"]


# -- graph building ------------------------------------------------------------------------


class _Graph:
    """Nodes, initializers and constants with generated names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count = 0

    def op(self, op_type: str, *inputs: str, outputs: int = 1, domain: str = "", **attrs):
        names = [f"{op_type.lower()}_{self._count}_{j}" for j in range(outputs)]
        self._count += 1
        self.nodes.append(helper.make_node(op_type, list(inputs), names, domain=domain, **attrs))
        return names[0] if outputs == 1 else names

    def named(self, op_type: str, inputs: Sequence[str], output: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], **attrs))
        return output

    def const(self, value, dtype=np.int64) -> str:
        name = f"const_{self._count}"
        self._count += 1
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def weight(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(array, name))
        return name


def _embed(g: _Graph, w: dict[str, np.ndarray], positions: str = "position_ids") -> str:
    tok = g.op("Gather", g.weight("emb", w["emb"]), "input_ids")
    pos = g.op("Gather", g.weight("pos", w["pos"]), positions)
    return g.op("Add", tok, pos)


def _heads(g: _Graph, x: str, heads: int) -> str:
    """[B, S, heads*D] -> [B, heads, S, D]."""
    shaped = g.op("Reshape", x, g.const([0, 0, heads, HEAD]))
    return g.op("Transpose", shaped, perm=[0, 2, 1, 3])


def _masked_attention(g: _Graph, q: str, k: str, v: str, allowed: str) -> str:
    """q [B,H,S,D], k/v [B,Hkv,T,D], allowed bool broadcastable to [B,1,1,S,T] -> [B,S,H*D]."""
    group = HEADS // KV_HEADS
    q5 = g.op("Reshape", q, g.const([0, KV_HEADS, group, -1, HEAD]))
    k5 = g.op("Unsqueeze", k, g.const([2]))
    v5 = g.op("Unsqueeze", v, g.const([2]))
    scores = g.op("MatMul", q5, g.op("Transpose", k5, perm=[0, 1, 2, 4, 3]))
    scores = g.op("Mul", scores, g.const(HEAD**-0.5, np.float32))
    scores = g.op("Where", allowed, scores, g.const(-1e9, np.float32))
    probs = g.op("Softmax", scores, axis=-1)
    out = g.op("MatMul", probs, v5)  # [B, Hkv, G, S, D]
    out = g.op("Reshape", out, g.const([0, HEADS, -1, HEAD]))
    out = g.op("Transpose", out, perm=[0, 2, 1, 3])
    return g.op("Reshape", out, g.const([0, 0, HEADS * HEAD]))


def _blocked_attention(g, q, k, v, q_abs, k_all, window, blocks: int) -> str:
    """Attention over the cache read in ``blocks`` slices, merged with an online softmax
    (running max, rescaled sums): the BlockedKV scheme."""
    group = HEADS // KV_HEADS
    q5 = g.op("Reshape", q, g.const([0, KV_HEADS, group, -1, HEAD]))
    size = CAPACITY // blocks
    run_max = run_sum = run_out = None
    for b in range(blocks):
        lo, hi = g.const([b * size]), g.const([(b + 1) * size])
        kb = g.op("Unsqueeze", g.op("Slice", k, lo, hi, g.const([2])), g.const([2]))
        vb = g.op("Unsqueeze", g.op("Slice", v, lo, hi, g.const([2])), g.const([2]))
        idx = g.op("Slice", k_all, lo, hi, g.const([0]))
        valid = g.op("GreaterOrEqual", q_abs, g.const(0))
        allowed = g.op("And", _band(g, q_abs, idx, window), valid)
        scores = g.op("MatMul", q5, g.op("Transpose", kb, perm=[0, 1, 2, 4, 3]))
        scores = g.op("Mul", scores, g.const(HEAD**-0.5, np.float32))
        scores = g.op("Where", allowed, scores, g.const(-1e9, np.float32))
        block_max = g.op("ReduceMax", scores, g.const([-1]), keepdims=1)
        new_max = block_max if run_max is None else g.op("Max", run_max, block_max)
        p = g.op("Exp", g.op("Sub", scores, new_max))
        block_sum = g.op("ReduceSum", p, g.const([-1]), keepdims=1)
        block_out = g.op("MatMul", p, vb)
        if run_max is None:
            run_sum, run_out = block_sum, block_out
        else:
            scale = g.op("Exp", g.op("Sub", run_max, new_max))
            run_sum = g.op("Add", g.op("Mul", run_sum, scale), block_sum)
            run_out = g.op("Add", g.op("Mul", run_out, scale), block_out)
        run_max = new_max
    out = g.op("Div", run_out, run_sum)  # [B, Hkv, G, S, D]
    out = g.op("Reshape", out, g.const([0, HEADS, -1, HEAD]))
    out = g.op("Transpose", out, perm=[0, 2, 1, 3])
    return g.op("Reshape", out, g.const([0, 0, HEADS * HEAD]))


def _band(g: _Graph, q_abs: str, k_idx: str, window: int | None) -> str:
    """allowed = k <= q (and q - k < window), broadcasting q_abs [..., S, 1] and k_idx [T]."""
    allowed = g.op("LessOrEqual", k_idx, q_abs)
    if window:
        near = g.op("Less", g.op("Sub", q_abs, k_idx), g.const(window))
        allowed = g.op("And", allowed, near)
    return allowed


def _windowed(i: int, window: int | None, window_layers: Sequence[int]) -> int | None:
    return window if window and (not window_layers or i in window_layers) else None


def build(
    layout: str,
    path: Path,
    w: dict[str, np.ndarray],
    *,
    window: int | None = None,
    window_layers: Sequence[int] = (),
    static_batch: int | str = "batch",
    blocks: int = 1,
    ctx: int = CAPACITY,
) -> Path:
    """Write the decoder in ``layout`` to ``path`` and return it (``blocks``: graph-scattered
    attention reads the cache in that many blocks, merged with an online softmax)."""
    if layout in FIXED_SHAPE:
        return _build_fixed_shape(layout, path, w, ctx, window, window_layers)
    g = _Graph()
    ints = TensorProto.INT64
    fp = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("input_ids", ints, [static_batch, "seq"]),
        helper.make_tensor_value_info("position_ids", ints, [static_batch, "seq"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", fp, [static_batch, "seq", VOCAB])]
    x = _embed(g, w)
    if layout == "static-scatter":
        kv_shape = [static_batch, CAPACITY, KV_HEADS * HEAD]
        past = ("key_cache.%d", "value_cache.%d")
        present = ("updated_key_cache.%d", "updated_value_cache.%d")
        inputs += [
            helper.make_tensor_value_info("write_indices", ints, [static_batch]),
            helper.make_tensor_value_info("nonpad_kv_seqlen", ints, [static_batch]),
        ]
    elif layout == "graph-scattered":
        kv_shape = [static_batch, KV_HEADS, CAPACITY, HEAD]
        past = ("past_key.%d", "past_value.%d")
        present = ("past_key.%d_RetainedState", "past_value.%d_RetainedState")
    else:
        kv_shape = [static_batch, KV_HEADS, "past_seq", HEAD]
        past = ("past_key_values.%d.key", "past_key_values.%d.value")
        present = ("present.%d.key", "present.%d.value")
        inputs.append(
            helper.make_tensor_value_info("attention_mask", ints, [static_batch, "total"])
        )
    fixed = layout in ("static-scatter", "graph-scattered")
    present_shape = kv_shape if fixed else [static_batch, KV_HEADS, "t", HEAD]
    for i in range(LAYERS):
        for name in past:
            inputs.append(helper.make_tensor_value_info(name % i, fp, kv_shape))
        for name in present:
            outputs.append(helper.make_tensor_value_info(name % i, fp, present_shape))
    if layout == "concat":
        # Right-padded rows: compare positions, not columns (key position = running mask count).
        mask = g.op("Cast", "attention_mask", to=TensorProto.BOOL)  # [B, T]
        mask = g.op("Unsqueeze", mask, g.const([1, 2, 3]))  # [B, 1, 1, 1, T]
        k_idx = g.op("Sub", g.op("CumSum", "attention_mask", g.const(1)), g.const(1))
        k_idx = g.op("Unsqueeze", k_idx, g.const([1, 2, 3]))  # [B, 1, 1, 1, T]
        q_abs = g.op("Unsqueeze", "position_ids", g.const([1, 2, 4]))  # [B, 1, 1, S, 1]
    elif layout == "share-buffer":
        seqlens = g.op("ReduceSum", "attention_mask", g.const([1]), keepdims=0)
        seqlens = g.op("Cast", g.op("Sub", seqlens, g.const(1)), to=TensorProto.INT32)
        total = g.op("Shape", "attention_mask", start=1, end=2)
        total = g.op("Cast", g.op("Squeeze", total), to=TensorProto.INT32)
    elif layout == "graph-scattered":
        # QEfficient style: rows land at position_ids (pads carry -1: the last slot, masked).
        q_abs = g.op("Unsqueeze", "position_ids", g.const([1, 2, 4]))  # [B, 1, 1, S, 1]
        scatter_idx = g.op(
            "Expand",
            g.op("Unsqueeze", "position_ids", g.const([1, 3])),  # [B, 1, S, 1]
            g.op("Concat", g.op("Shape", "input_ids", start=0, end=1), g.const([KV_HEADS]),
                 g.op("Shape", "input_ids", start=1, end=2), g.const([HEAD]), axis=0),
        )  # fmt: skip
        k_all = g.op("Range", g.const(0), g.const(CAPACITY), g.const(1))  # [T]
    else:
        seq = g.op("Squeeze", g.op("Shape", "input_ids", start=1, end=2))
        q_abs = g.op(
            "Add",
            g.op("Unsqueeze", "write_indices", g.const([1])),
            g.op("Unsqueeze", g.op("Range", g.const(0), seq, g.const(1)), g.const([0])),
        )  # [B, S]
        q_abs = g.op("Unsqueeze", q_abs, g.const([1, 3]))  # [B, 1, S, 1]
        k_idx = g.op("Range", g.const(0), g.const(CAPACITY), g.const(1))  # [T]
    for i in range(LAYERS):
        win = _windowed(i, window, window_layers)
        q = g.op("MatMul", x, g.weight(f"wq{i}", w[f"wq{i}"]))
        k = g.op("MatMul", x, g.weight(f"wk{i}", w[f"wk{i}"]))
        v = g.op("MatMul", x, g.weight(f"wv{i}", w[f"wv{i}"]))
        pk, pv = past[0] % i, past[1] % i
        qk, qv = present[0] % i, present[1] % i
        if layout == "concat":
            g.named("Concat", [pk, _heads(g, k, KV_HEADS)], qk, axis=2)
            g.named("Concat", [pv, _heads(g, v, KV_HEADS)], qv, axis=2)
            allowed = g.op("And", mask, _band(g, q_abs, k_idx, win))
            o = _masked_attention(g, _heads(g, q, HEADS), qk, qv, allowed)
        elif layout == "graph-scattered":
            for src, dst, new_rows in ((pk, qk, k), (pv, qv, v)):
                rows = _heads(g, new_rows, KV_HEADS)
                g.named("ScatterElements", [src, scatter_idx, rows], dst, axis=2)
            o = _blocked_attention(g, _heads(g, q, HEADS), qk, qv, q_abs, k_all, win, blocks)
        elif layout == "share-buffer":
            o = f"attn_{i}"
            g.nodes.append(
                helper.make_node(
                    "GroupQueryAttention",
                    [q, k, v, pk, pv, seqlens, total],
                    [o, qk, qv],
                    domain="com.microsoft",
                    num_heads=HEADS,
                    kv_num_heads=KV_HEADS,
                    scale=HEAD**-0.5,
                    local_window_size=win or -1,
                    **({"sliding_window_cache": 1} if win else {}),
                )
            )
        else:
            g.named("TensorScatter", [pk, k, "write_indices"], qk, axis=1)
            g.named("TensorScatter", [pv, v, "write_indices"], qv, axis=1)
            # As mobius exports it: is_causal, queries aligned to the end of nonpad_kv_seqlen;
            # a windowed layer needs an explicit band mask instead.
            allowed = _band(g, q_abs, k_idx, win) if win else ""  # [B, 1, S, T]
            o = g.op(
                "Attention", q, qk, qv, allowed, "", "", "nonpad_kv_seqlen",
                outputs=1, q_num_heads=HEADS, kv_num_heads=KV_HEADS, scale=HEAD**-0.5,
                is_causal=0 if win else 1,
            )  # fmt: skip
        x = g.op("Add", x, g.op("MatMul", o, g.weight(f"wo{i}", w[f"wo{i}"])))
    return _save(g, layout, x, w, inputs, outputs, path)


def _save(g: _Graph, layout: str, x: str, w, inputs: list, outputs: list, path: Path) -> Path:
    logits = g.op("MatMul", x, g.weight("lm", w["lm"]))
    g.named("Add", [logits, g.weight("lm_bias", w["lm_bias"])], "logits")
    graph = helper.make_graph(g.nodes, f"tiny_{layout}", inputs, outputs, initializer=g.inits)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = IR_VERSION
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _build_fixed_shape(layout, path, w, ctx, window, window_layers) -> Path:
    """Every shape fixed: CHUNK new tokens, a ctx-row past in, the chunk's K/V out."""
    g = _Graph()
    ints, fp = TensorProto.INT64, TensorProto.FLOAT
    positions = "cache_position" if layout == "static-index-copy" else "position_ids"
    inputs = [
        helper.make_tensor_value_info("input_ids", ints, ["batch", CHUNK]),
        helper.make_tensor_value_info(positions, ints, ["batch", CHUNK]),
        helper.make_tensor_value_info("attention_mask", ints, ["batch", ctx + CHUNK]),
    ]
    outputs = [helper.make_tensor_value_info("logits", fp, ["batch", CHUNK, VOCAB])]
    x = _embed(g, w, positions)
    mask = g.op("Cast", "attention_mask", to=TensorProto.BOOL)
    mask = g.op("Unsqueeze", mask, g.const([1, 2, 3]))  # [B, 1, 1, 1, ctx + CHUNK]
    s, t = np.arange(CHUNK)[:, None], np.arange(ctx + CHUNK)[None, :]
    causal = g.const((t < ctx) | (t - ctx <= s), np.bool_)  # past slots, or not after the query
    allowed = g.op("And", mask, causal)
    for i in range(LAYERS):
        if _windowed(i, window, window_layers):
            raise ValueError("the fixed-shape fixtures have no windowed layers")
        q = g.op("MatMul", x, g.weight(f"wq{i}", w[f"wq{i}"]))
        k = g.op("MatMul", x, g.weight(f"wk{i}", w[f"wk{i}"]))
        v = g.op("MatMul", x, g.weight(f"wv{i}", w[f"wv{i}"]))
        both = []
        for kind, new in (("key", k), ("value", v)):
            past, present = f"past_key_values.{i}.{kind}", f"present.{i}.{kind}"
            inputs.append(helper.make_tensor_value_info(past, fp, ["batch", KV_HEADS, ctx, HEAD]))
            outputs.append(
                helper.make_tensor_value_info(present, fp, ["batch", KV_HEADS, CHUNK, HEAD])
            )
            g.named("Identity", [_heads(g, new, KV_HEADS)], present)
            both.append(g.op("Concat", past, present, axis=2))
        o = _masked_attention(g, _heads(g, q, HEADS), both[0], both[1], allowed)
        x = g.op("Add", x, g.op("MatMul", o, g.weight(f"wo{i}", w[f"wo{i}"])))
    return _save(g, layout, x, w, inputs, outputs, path)


def config(
    layout: str,
    *,
    window: int | None = None,
    window_layers: Sequence[int] = (),
    cache_slack: int = 0,
) -> dict:
    """The v1 genai_config.json for ``build(layout, ...)``'s model.onnx."""
    inputs = {"input_ids": "input_ids", "position_ids": "position_ids"}
    outputs = {"logits": "logits"}
    if layout == "graph-scattered":
        inputs.update(past_key_names="past_key.%d", past_value_names="past_value.%d")
        outputs.update(
            present_key_names="past_key.%d_RetainedState",
            present_value_names="past_value.%d_RetainedState",
        )
    elif layout == "static-scatter":
        inputs.update(
            past_key_names="key_cache.%d",
            past_value_names="value_cache.%d",
            write_indices="write_indices",
            nonpad_kv_seqlen="nonpad_kv_seqlen",
        )
        outputs.update(
            present_key_names="updated_key_cache.%d", present_value_names="updated_value_cache.%d"
        )
    else:
        if layout == "static-index-copy":
            del inputs["position_ids"]
            inputs["cache_position"] = "cache_position"
        inputs.update(
            attention_mask="attention_mask",
            past_key_names="past_key_values.%d.key",
            past_value_names="past_key_values.%d.value",
        )
        outputs.update(present_key_names="present.%d.key", present_value_names="present.%d.value")
    decoder = {
        "filename": "model.onnx",
        "num_key_value_heads": KV_HEADS,
        "num_attention_heads": HEADS,
        "head_size": HEAD,
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "inputs": inputs,
        "outputs": outputs,
    }
    if window:
        decoder["sliding_window"] = {
            "window_size": window,
            "layers": list(window_layers),
            "slide_key_value_cache": False,
            "slide_inputs": False,
            "cache_slack": cache_slack,
        }
    return {
        "model": {
            "type": "tiny",
            "vocab_size": VOCAB,
            "context_length": MAX_POS,
            "pad_token_id": PAD,
            "bos_token_id": 1,
            "eos_token_id": EOS,
            "decoder": decoder,
        },
        "search": {
            "max_length": CAPACITY,
            "do_sample": False,
            "past_present_share_buffer": layout == "share-buffer",
        },
    }


def folder(
    root: Path,
    layout: str,
    w: dict[str, np.ndarray],
    *,
    window: int | None = None,
    window_layers: Sequence[int] = (),
    cache_slack: int = 0,
    blocks: int = 1,
    ctx: int = CAPACITY,
) -> Path:
    """A model folder (model.onnx + genai_config.json) for ``layout``."""
    out = root / (layout if blocks == 1 else f"{layout}-{blocks}")
    if ctx != CAPACITY:
        out = out.with_name(f"{out.name}-ctx{ctx}")
    build(
        layout,
        out / "model.onnx",
        w,
        window=window,
        window_layers=window_layers,
        blocks=blocks,
        ctx=ctx,
    )
    doc = config(layout, window=window, window_layers=window_layers, cache_slack=cache_slack)

    (out / "genai_config.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return out
