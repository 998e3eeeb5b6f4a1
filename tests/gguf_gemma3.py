"""A tiny Gemma 3 GGUF written with the ``gguf`` package's writer, and a NumPy Gemma 3 forward
pass over any Gemma 3 GGUF, for the importer's tests.

The forward pass is independent of ``genai_runtime.importer``: it reads the file with the ``gguf``
package's reader, dequantises with ``gguf.quants`` and follows llama.cpp's / transformers' Gemma 3
math in float64: embedding * sqrt(hidden); RMSNorm by the stored ``1 + w``; per-head q/k norms;
half-split (NEOX) rope with base 10000 on local layers and the file's base on global ones; local
layers see the last ``sliding_window`` positions including their own; GELU-tanh gated MLP; post
norms on both branches; the embedding table as lm_head.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

gguf = __import__("pytest").importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFReader, GGUFWriter, quants  # noqa: E402

# 6 layers: llama.cpp's Gemma 3 pattern makes layers 0-4 local and layer 5 global.
TINY = {"layers": 6, "hidden": 64, "ffn": 96, "heads": 4, "kv_heads": 2, "head": 32, "ctx": 128}
WINDOW = 5
LOCAL_BASE = 10000.0
GLOBAL_EVERY = 6

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
PIECES = [
    *"▁thelonigr",
    "▁t",
    "he",
    "▁the",
    "in",
    "▁a",
    "▁in",
    "an",
    "▁an",
    "ing",
    "▁th",
    "er",
    "ll",
    "llo",
    "hello",
    "▁hello",
]
USER = ["\n", "\n\n", "<b>", "  ", "   "]  # user-defined: whole-matched (space runs are not)


def tiny_spm_vocab() -> tuple[list[str], list[int]]:
    """SentencePiece-style pieces: specials, byte-fallback tokens, merges' pieces, user tokens."""
    # Single characters first: BPE builds every piece up from them.
    tokens = SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + PIECES + USER
    types = [3] * len(SPECIALS) + [6] * 256 + [1] * len(PIECES) + [4] * len(USER)
    return tokens, types


def write_tiny_gemma3(
    path: Path, *, qtype: Q = Q.Q8_0, seed: int = 0, softcaps: tuple[float, float] | None = None
) -> Path:
    """6 random layers quantised as ``qtype``; ``softcaps`` (attention, final) as Gemma 2 has."""
    t = TINY
    rng = np.random.default_rng(seed)
    tokens, types = tiny_spm_vocab()
    w = GGUFWriter(str(path), "gemma3")
    w.add_block_count(t["layers"])
    w.add_context_length(t["ctx"])
    w.add_embedding_length(t["hidden"])
    w.add_feed_forward_length(t["ffn"])
    w.add_head_count(t["heads"])
    w.add_head_count_kv(t["kv_heads"])
    w.add_key_length(t["head"])
    w.add_value_length(t["head"])
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(WINDOW)
    if softcaps:
        w.add_attn_logit_softcapping(softcaps[0])
        w.add_final_logit_softcapping(softcaps[1])
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)  # as Gemma GGUFs state it
    q_dim, kv_dim = t["heads"] * t["head"], t["kv_heads"] * t["head"]

    def weight(name: str, out_f: int, in_f: int, scale: float = 0.15) -> None:
        data = (rng.standard_normal((out_f, in_f)) * scale).astype(np.float32)
        raw = quants.quantize(data, qtype)
        w.add_tensor(name, raw, raw_dtype=qtype)

    def norm(name: str, n: int) -> None:  # stored as 1 + w, as llama.cpp's converter writes
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    weight("token_embd.weight", len(tokens), t["hidden"], scale=1.0)
    for i in range(t["layers"]):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", t["hidden"])
        weight(p + "attn_q.weight", q_dim, t["hidden"])
        weight(p + "attn_k.weight", kv_dim, t["hidden"])
        weight(p + "attn_v.weight", kv_dim, t["hidden"])
        norm(p + "attn_q_norm.weight", t["head"])
        norm(p + "attn_k_norm.weight", t["head"])
        weight(p + "attn_output.weight", t["hidden"], q_dim)
        norm(p + "post_attention_norm.weight", t["hidden"])
        norm(p + "ffn_norm.weight", t["hidden"])
        weight(p + "ffn_gate.weight", t["ffn"], t["hidden"])
        weight(p + "ffn_up.weight", t["ffn"], t["hidden"])
        weight(p + "ffn_down.weight", t["hidden"], t["ffn"])
        norm(p + "post_ffw_norm.weight", t["hidden"])
    norm("output_norm.weight", t["hidden"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---------------------------------------------------------------------------------------------
# NumPy reference forward pass


class GemmaWeights:
    """Metadata and dequantised tensors of a Gemma 3 GGUF (read once, by the gguf package)."""

    def __init__(self, path: Path):
        self.reader = GGUFReader(str(path))
        self._tensors = {t.name: t for t in self.reader.tensors}

    def meta(self, key: str, default=None):
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def __call__(self, name: str, dtype=np.float64) -> np.ndarray:
        t = self._tensors[name]
        data = quants.dequantize(np.asarray(t.data), t.tensor_type).astype(dtype)
        return data.reshape(-1, int(t.shape[0])) if len(t.shape) > 1 else data.reshape(-1)


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope_neox(x: np.ndarray, base: float) -> np.ndarray:
    """Rotate (x[i], x[i + d/2]) by pos * base^(-2i/d); x is [S, H, d]."""
    seq, _, dim = x.shape
    ang = np.arange(seq)[:, None] * base ** (-np.arange(0, dim, 2) / dim)[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., : dim // 2], x[..., dim // 2 :]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def numpy_gemma3_logits(
    weights: GemmaWeights, ids: list[int], window: int | None = None
) -> np.ndarray:
    """Logits [len(ids), vocab] of the Gemma 3 GGUF on ``ids`` (one sequence, no cache);
    ``window`` overrides the file's sliding window."""
    m, a = weights.meta, "gemma3"
    layers, heads = m(f"{a}.block_count"), m(f"{a}.attention.head_count")
    kv_heads, hd = m(f"{a}.attention.head_count_kv"), m(f"{a}.attention.key_length")
    eps = m(f"{a}.attention.layer_norm_rms_epsilon")
    window = window or m(f"{a}.attention.sliding_window")
    global_base = m(f"{a}.rope.freq_base")
    attn_cap, final_cap = m(f"{a}.attn_logit_softcapping"), m(f"{a}.final_logit_softcapping")
    embed = weights("token_embd.weight", np.float32)
    x = embed[np.asarray(ids)].astype(np.float64) * np.sqrt(embed.shape[1])
    seq = len(ids)
    pos = np.arange(seq)
    causal = np.where(pos[None, :] <= pos[:, None], 0.0, -np.inf)
    windowed = np.where(pos[:, None] - pos[None, :] < window, causal, -np.inf)
    for i in range(layers):
        p = f"blk.{i}."
        local = (i + 1) % GLOBAL_EVERY != 0
        h = _rms(x, weights(p + "attn_norm.weight"), eps)
        q = (h @ weights(p + "attn_q.weight").T).reshape(seq, heads, hd)
        k = (h @ weights(p + "attn_k.weight").T).reshape(seq, kv_heads, hd)
        v = (h @ weights(p + "attn_v.weight").T).reshape(seq, kv_heads, hd)
        q = _rms(q, weights(p + "attn_q_norm.weight"), eps)
        k = _rms(k, weights(p + "attn_k_norm.weight"), eps)
        base = LOCAL_BASE if local else global_base
        q, k = _rope_neox(q, base), _rope_neox(k, base)
        rep = heads // kv_heads
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
        if attn_cap:
            scores = attn_cap * np.tanh(scores / attn_cap)
        scores = scores + (windowed if local else causal)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = scores / scores.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(seq, heads * hd)
        y = attn @ weights(p + "attn_output.weight").T
        x = x + _rms(y, weights(p + "post_attention_norm.weight"), eps)
        h = _rms(x, weights(p + "ffn_norm.weight"), eps)
        gate = h @ weights(p + "ffn_gate.weight").T
        act = _gelu_tanh(gate) * (h @ weights(p + "ffn_up.weight").T)
        y = act @ weights(p + "ffn_down.weight").T
        x = x + _rms(y, weights(p + "post_ffw_norm.weight"), eps)
    x = _rms(x, weights("output_norm.weight"), eps)
    # Vocab in chunks: the real table is 262k rows.
    logits = np.concatenate(
        [x @ embed[s : s + 32768].T.astype(np.float64) for s in range(0, len(embed), 32768)],
        axis=1,
    )
    return final_cap * np.tanh(logits / final_cap) if final_cap else logits
