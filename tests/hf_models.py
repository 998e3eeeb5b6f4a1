"""Tiny random Hugging Face checkpoints written here (config.json + safetensors from NumPy + a
tokenizer.json built with the ``tokenizers`` library), the same weights as a GGUF (the ``gguf``
package's writer, named and permuted as llama.cpp's converter does), and a NumPy forward pass
of each architecture over the folder, for the importer's tests.

The forward pass follows transformers' modelling code, independently of
``genai_runtime.importer``: rotate-half rope on the first ``partial_rotary_factor`` of each head
(longrope: short factors up to ``original_max_position_embeddings``, long past it, both scaled
by the attention factor), q/k/v biases, per-head q/k RMSNorm before rope, a sliding window of
``sliding_window`` keys including the query's own, fused qkv / gate_up split as Phi-3 does, tied
or untied lm_head; float64 throughout.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
safetensors_numpy = pytest.importorskip("safetensors.numpy")
tokenizers = pytest.importorskip("tokenizers")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFWriter  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BASE = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# Each architecture's config.json differences from BASE (the structure its tests exercise).
ARCHS: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"]},
    "mistral": {"model_type": "mistral", "sliding_window": 5, "rope_theta": 1e6},
    "qwen2": {
        "model_type": "qwen2",
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": 4096,
    },
    "qwen3": {"model_type": "qwen3", "head_dim": 32, "attention_bias": False},
    "phi3": {
        "model_type": "phi3",
        "num_attention_heads": 2,  # head 32: rotary on 16 (GroupQueryAttention wants 16k)
        "num_key_value_heads": 1,
        "partial_rotary_factor": 0.5,
        "original_max_position_embeddings": 16,
        "rope_scaling": {"type": "longrope"},  # factors filled in by write_hf
        "sliding_window": 48,
    },
    "gemma3": {
        "model_type": "gemma3_text",
        "num_hidden_layers": 6,
        "head_dim": 32,
        "query_pre_attn_scalar": 32,
        "sliding_window": 5,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        "tie_word_embeddings": True,
        "hidden_activation": "gelu_pytorch_tanh",
    },
}
GGUF_ARCH = {"mistral": "llama"}  # llama.cpp converts Mistral as llama


def byte_tokens() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


def qwen_tokenizer(corpus: list[str], merges: int = 120) -> Any:
    """A Qwen-style byte-level BPE (NFC, Qwen's split regex, byte-level) trained on ``corpus``."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=256 + merges,
        special_tokens=[],
        initial_alphabet=byte_tokens(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens(SPECIALS)
    return tok


CORPUS = [
    "the thin ant and the theory of the thing; def main(): return 42",
    "Привет, мир! Ça va très bien. 東京は日本の首都です。 12345 67890",
    "import numpy as np\nfor i in range(10):\n    print(i ** 2)\n",
] * 4


def write_hf(
    folder: Path,
    arch: str,
    *,
    seed: int = 0,
    dtype: Any = np.float32,
    added_tokens: tuple[str, ...] = (),
) -> Path:
    """A random-weight checkpoint of ``arch`` (ARCHS) in ``folder``: config.json,
    model.safetensors (``dtype``), tokenizer.json, tokenizer_config.json,
    generation_config.json. ``added_tokens``: extra single tokens in the vocabulary (as
    Qwen3's ``<think>`` and ``</think>``)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tok = qwen_tokenizer(CORPUS)
    if added_tokens:
        tok.add_tokens(list(added_tokens))
    tok.save(str(folder / "tokenizer.json"))
    cfg = {**BASE, **ARCHS[arch], "vocab_size": tok.get_vocab_size()}
    cfg["eos_token_id"] = tok.token_to_id("<|im_end|>")
    cfg["bos_token_id"] = tok.token_to_id("<|im_start|>")
    h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // heads
    ffn, vocab = cfg["intermediate_size"], cfg["vocab_size"]
    if arch == "phi3":
        rot = int(hd * cfg["partial_rotary_factor"]) // 2
        cfg["rope_scaling"] = {
            "type": "longrope",
            "short_factor": (1.0 + 0.5 * rng.random(rot)).round(3).tolist(),
            "long_factor": (2.0 + 4.0 * rng.random(rot)).round(3).tolist(),
        }
    tensors: dict[str, np.ndarray] = {}

    def mat(name: str, out_f: int, in_f: int, scale: float = 0.15) -> None:
        tensors[name] = (rng.standard_normal((out_f, in_f)) * scale).astype(dtype)

    def vec(name: str, n: int, center: float = 1.0) -> None:
        tensors[name] = (center + 0.1 * rng.standard_normal(n)).astype(dtype)

    norm_center = 0.0 if arch == "gemma3" else 1.0  # Gemma multiplies by 1 + w
    mat("model.embed_tokens.weight", vocab, h, 1.0)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        vec(p + "input_layernorm.weight", h, norm_center)
        vec(p + "post_attention_layernorm.weight", h, norm_center)
        if arch == "phi3":
            mat(p + "self_attn.qkv_proj.weight", (heads + 2 * kv) * hd, h)
            mat(p + "mlp.gate_up_proj.weight", 2 * ffn, h)
        else:
            mat(p + "self_attn.q_proj.weight", heads * hd, h)
            mat(p + "self_attn.k_proj.weight", kv * hd, h)
            mat(p + "self_attn.v_proj.weight", kv * hd, h)
            mat(p + "mlp.gate_proj.weight", ffn, h)
            mat(p + "mlp.up_proj.weight", ffn, h)
        mat(p + "self_attn.o_proj.weight", h, heads * hd)
        mat(p + "mlp.down_proj.weight", h, ffn)
        if arch == "qwen2":
            for t, n in (("q", heads * hd), ("k", kv * hd), ("v", kv * hd)):
                vec(p + f"self_attn.{t}_proj.bias", n, 0.0)
        if arch in ("qwen3", "gemma3"):
            vec(p + "self_attn.q_norm.weight", hd, norm_center)
            vec(p + "self_attn.k_norm.weight", hd, norm_center)
        if arch == "gemma3":
            vec(p + "pre_feedforward_layernorm.weight", h, 0.0)
            vec(p + "post_feedforward_layernorm.weight", h, 0.0)
    vec("model.norm.weight", h, norm_center)
    if not cfg["tie_word_embeddings"]:
        mat("lm_head.weight", vocab, h)
    safetensors_numpy.save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    tok_cfg = {
        "chat_template": CHAT_TEMPLATE,
        "eos_token": "<|im_end|>",
        "bos_token": None,
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    gen = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20}
    (folder / "generation_config.json").write_text(json.dumps(gen))
    return folder


def load(folder: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    cfg = json.loads((folder / "config.json").read_text())
    return cfg, safetensors_numpy.load_file(str(folder / "model.safetensors"))


# ---------------------------------------------------------------------------------------------
# The same weights as a GGUF


def write_gguf_from_hf(folder: Path, path: Path, qtype: Q = Q.F32) -> Path:
    """``folder``'s checkpoint as llama.cpp's converter would write it: GGUF names, Q/K rows of
    llama permuted for GGML's adjacent-pair rope, Gemma norms stored as ``1 + w``, tokenizer
    metadata from tokenizer.json (pre-tokenizer ``qwen2``); matrices stored as ``qtype``."""
    cfg, t = load(folder)
    mt = cfg["model_type"]
    arch = {"gemma3_text": "gemma3"}.get(mt, GGUF_ARCH.get(mt, mt))
    h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // heads
    w = GGUFWriter(str(path), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(h)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = rope_settings(cfg)
    w.add_rope_freq_base(rope["theta"])
    rot = int(hd * rope["partial"])
    w.add_rope_dimension_count(rot)
    if cfg.get("sliding_window") and cfg.get("use_sliding_window") is not False:
        w.add_sliding_window(cfg["sliding_window"])
    scaling = rope["scaling"]
    if scaling.get("type") == "longrope":
        orig = cfg["original_max_position_embeddings"]
        w.add_rope_scaling_orig_ctx_len(orig)
        ratio = cfg["max_position_embeddings"] / orig
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(ratio) / math.log(orig)))
        w.add_tensor("rope_factors_short.weight", np.asarray(scaling["short_factor"], np.float32))
        w.add_tensor("rope_factors_long.weight", np.asarray(scaling["long_factor"], np.float32))
    _tokenizer_metadata(w, folder, cfg)

    def put(name: str, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array.astype(np.float32))
        if array.ndim == 2 and qtype != Q.F32:
            w.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, array)

    def permute(m: np.ndarray, n_head: int) -> np.ndarray:
        return (
            m.reshape(n_head, 2, m.shape[0] // n_head // 2, *m.shape[1:])
            .swapaxes(1, 2)
            .reshape(m.shape)
        )

    offset = 1.0 if arch == "gemma3" else 0.0
    names = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": (
            "post_attention_norm.weight" if arch == "gemma3" else "ffn_norm.weight"
        ),
        "pre_feedforward_layernorm.weight": "ffn_norm.weight",
        "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.bias": "attn_v.bias",
        "self_attn.qkv_proj.weight": "attn_qkv.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "self_attn.q_norm.weight": "attn_q_norm.weight",
        "self_attn.k_norm.weight": "attn_k_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.gate_up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    put("token_embd.weight", t["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for suffix, gname in names.items():
            if p + suffix not in t:
                continue
            value = t[p + suffix]
            if arch == "llama" and suffix == "self_attn.q_proj.weight":
                value = permute(value, heads)
            if arch == "llama" and suffix == "self_attn.k_proj.weight":
                value = permute(value, kv)
            if suffix.endswith("norm.weight"):
                value = value + offset
            put(f"blk.{i}.{gname}", value)
    put("output_norm.weight", t["model.norm.weight"] + offset)
    if "lm_head.weight" in t:
        put("output.weight", t["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def rope_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """theta, partial rotary factor and scaling, from transformers 5's ``rope_parameters`` (per
    layer type for Gemma 3: the full-attention set) or the older top-level keys."""
    params = cfg.get("rope_parameters") or {}
    params = params.get("full_attention", params)
    kind = params.get("rope_type", "default")
    scaling = cfg.get("rope_scaling") or ({**params, "type": kind} if kind != "default" else {})
    return {
        "theta": params.get("rope_theta", cfg.get("rope_theta", 10000.0)),
        "partial": params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)),
        "scaling": scaling,
    }


def _tokenizer_metadata(w: Any, folder: Path, cfg: dict[str, Any]) -> None:
    """tokenizer.json's vocabulary and merges as GGUF ``tokenizer.ggml.*`` (added tokens are
    control tokens), with the chat template and special ids."""
    doc = json.loads((folder / "tokenizer.json").read_text())
    vocab = dict(doc["model"]["vocab"])
    for added in doc["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    specials = {a["content"] for a in doc["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_pad_token_id(vocab.get("<|endoftext|>", cfg["eos_token_id"]))
    w.add_add_bos_token(False)
    template = folder / "chat_template.jinja"
    w.add_chat_template(template.read_text() if template.is_file() else CHAT_TEMPLATE)


# ---------------------------------------------------------------------------------------------
# NumPy reference forward pass (transformers' semantics)


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, inv_freq: np.ndarray, scale: float) -> np.ndarray:
    """Rotate-half rope on the first 2*len(inv_freq) values of each head; x is [S, H, d]."""
    seq = x.shape[0]
    rot = 2 * len(inv_freq)
    ang = np.arange(seq)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(ang)[:, None, :] * scale, np.sin(ang)[:, None, :] * scale
    r, rest = x[..., :rot], x[..., rot:]
    a, b = r[..., : rot // 2], r[..., rot // 2 :]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos, rest], axis=-1)


def numpy_logits(folder: Path, ids: list[int]) -> np.ndarray:
    """Logits [len(ids), vocab] of the llama-family checkpoint in ``folder`` (no cache)."""
    cfg, t = load(folder)
    w = {k: v.astype(np.float64) for k, v in t.items()}
    h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // heads
    eps, seq = cfg["rms_norm_eps"], len(ids)
    rot = int(hd * cfg.get("partial_rotary_factor", 1.0))
    inv_freq = 1.0 / cfg.get("rope_theta", 10000.0) ** (np.arange(0, rot, 2) / rot)
    scale = 1.0
    scaling = cfg.get("rope_scaling") or {}
    if scaling.get("type") == "longrope":
        orig = cfg["original_max_position_embeddings"]
        long = seq > orig
        inv_freq = inv_freq / np.asarray(scaling["long_factor" if long else "short_factor"])
        ratio = cfg["max_position_embeddings"] / orig
        scale = math.sqrt(1 + math.log(ratio) / math.log(orig))
    pos = np.arange(seq)
    mask = np.where(pos[None, :] <= pos[:, None], 0.0, -np.inf)
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    if window:
        mask = np.where(pos[:, None] - pos[None, :] < window, mask, -np.inf)
    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = _rms(x, w[p + "input_layernorm.weight"], eps)
        if p + "self_attn.qkv_proj.weight" in w:
            qkv = a @ w[p + "self_attn.qkv_proj.weight"].T
            q, k, v = np.split(qkv, [heads * hd, (heads + kv) * hd], axis=-1)
        else:
            q, k, v = (a @ w[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
            if p + "self_attn.q_proj.bias" in w:
                q, k, v = (y + w[p + f"self_attn.{n}_proj.bias"] for y, n in zip((q, k, v), "qkv"))
        q, k, v = q.reshape(seq, heads, hd), k.reshape(seq, kv, hd), v.reshape(seq, kv, hd)
        if p + "self_attn.q_norm.weight" in w:
            q = _rms(q, w[p + "self_attn.q_norm.weight"], eps)
            k = _rms(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = _rope(q, inv_freq, scale), _rope(k, inv_freq, scale)
        k, v = np.repeat(k, heads // kv, axis=1), np.repeat(v, heads // kv, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(seq, heads * hd)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        a = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        if p + "mlp.gate_up_proj.weight" in w:
            gate, up = np.split(a @ w[p + "mlp.gate_up_proj.weight"].T, 2, axis=-1)
        else:
            gate = a @ w[p + "mlp.gate_proj.weight"].T
            up = a @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = _rms(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T
