"""Tiny GGUF files written with the ``gguf`` package's writer, and a NumPy forward pass over any
llama GGUF, for the importer's tests.

The forward pass is deliberately independent of ``genai_runtime.importer``: it dequantises with
``gguf.quants``, applies rope the way GGML does for llama (adjacent pairs, on the GGUF's own
permuted Q/K rows) and does attention and the MLP in float64.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

gguf = __import__("pytest").importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFReader, GGUFWriter, quants  # noqa: E402

TINY = {"layers": 2, "hidden": 64, "ffn": 96, "heads": 4, "kv_heads": 2, "ctx": 128}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_tokens() -> list[str]:
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


def tiny_vocab() -> tuple[list[str], list[str]]:
    """Special tokens, the 256 byte tokens and a few merges (``Ġt``, ``he``, ``Ġthe``)."""
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    tokens = SPECIALS + _byte_tokens() + ["Ġt", "he", "Ġthe", "in", "Ġa"]
    return tokens, merges


def write_tiny_gguf(
    path: Path,
    *,
    qtype: Q = Q.Q4_1,
    arch: str = "llama",
    tied: bool = True,
    seed: int = 0,
    head_qtype: Q | None = None,
    add_bos: bool = False,
    dims: dict[str, int] | None = None,
    sampling: dict[str, float] | None = None,
) -> Path:
    """A 2-layer llama GGUF with random weights quantised as ``qtype`` (``dims`` overrides
    TINY's sizes: K-quants need in-features that are multiples of 256; ``sampling``: llama.cpp's
    ``general.sampling.*`` keys, e.g. ``{"temp": 0.6}``)."""
    t = {**TINY, **(dims or {})}
    rng = np.random.default_rng(seed)
    tokens, merges = tiny_vocab()
    vocab = len(tokens)
    head = t["hidden"] // t["heads"]
    w = GGUFWriter(str(path), arch)
    w.add_block_count(t["layers"])
    w.add_context_length(t["ctx"])
    w.add_embedding_length(t["hidden"])
    w.add_feed_forward_length(t["ffn"])
    w.add_head_count(t["heads"])
    w.add_head_count_kv(t["kv_heads"])
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (vocab - len(SPECIALS)))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(add_bos)
    w.add_chat_template(CHAT_TEMPLATE)
    for key, value in (sampling or {}).items():
        add = w.add_int32 if isinstance(value, int) else w.add_float32
        add(f"general.sampling.{key}", value)

    def weight(name: str, out_f: int, in_f: int, q: Q = qtype, scale: float = 0.15) -> None:
        data = (rng.standard_normal((out_f, in_f)) * scale).astype(np.float32)
        if q == Q.F32:
            w.add_tensor(name, data)
            return
        if q == Q.Q4_K:
            raw = random_q4_k(rng, out_f, in_f, scale)
            w.add_tensor(name, raw, raw_dtype=q)
            return
        try:
            raw = quants.quantize(data, q)
        except NotImplementedError:  # a type the writer cannot make: zero blocks of its size
            block, size = gguf.GGML_QUANT_SIZES[q]
            raw = np.zeros((out_f, in_f // block * size), np.uint8)
        w.add_tensor(name, raw, raw_dtype=q)

    def norm(name: str) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(t["hidden"])).astype(np.float32))

    weight("token_embd.weight", vocab, t["hidden"], head_qtype or Q.Q8_0, scale=1.0)
    for i in range(t["layers"]):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight")
        weight(p + "attn_q.weight", t["hidden"], t["hidden"])
        weight(p + "attn_k.weight", t["kv_heads"] * head, t["hidden"])
        weight(p + "attn_v.weight", t["kv_heads"] * head, t["hidden"])
        weight(p + "attn_output.weight", t["hidden"], t["hidden"])
        norm(p + "ffn_norm.weight")
        weight(p + "ffn_gate.weight", t["ffn"], t["hidden"])
        weight(p + "ffn_up.weight", t["ffn"], t["hidden"])
        weight(p + "ffn_down.weight", t["hidden"], t["ffn"])
    norm("output_norm.weight")
    if not tied:
        weight("output.weight", vocab, t["hidden"], head_qtype or qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def random_q4_k(rng: np.random.Generator, rows: int, cols: int, scale: float) -> np.ndarray:
    """Random but valid Q4_K super-blocks (the gguf package cannot quantise to K-quants):
    random codes and 6-bit scales/mins, fp16 d / dmin sized so weights are about ``scale``."""
    supers = cols // 256
    raw = rng.integers(0, 256, (rows, supers, 144), dtype=np.uint8)
    d = np.abs(rng.standard_normal((rows, supers)) * scale / 800).astype(np.float16)
    dmin = np.abs(rng.standard_normal((rows, supers)) * scale / 160).astype(np.float16)
    raw[..., 0:2] = d.view(np.uint8).reshape(rows, supers, 2)
    raw[..., 2:4] = dmin.view(np.uint8).reshape(rows, supers, 2)
    return raw.reshape(rows, supers * 144)


def random_blocks(rng: np.random.Generator, qtype: Q, rows: int, cols: int) -> np.ndarray:
    """Valid ``qtype`` rows of ``cols`` values: quantised by the ``gguf`` package where it can,
    else random codes with fp16 scale fields set to small finite values."""
    data = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
    try:
        return quants.quantize(data, qtype)
    except NotImplementedError:
        pass
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    # Offsets of the fp16 fields in one block: (d, dmin) first for Q5_K, d last for Q6_K.
    fields = {Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q4_K: (0, 2)}[qtype]
    for at in fields:
        d = np.abs(rng.standard_normal((rows, cols // block)) * 0.002).astype(np.float16)
        raw[..., at : at + 2] = d.view(np.uint8).reshape(rows, cols // block, 2)
    return raw.reshape(rows, -1)


# ---------------------------------------------------------------------------------------------
# NumPy reference forward pass


def _meta(reader: GGUFReader, key: str):
    return reader.fields[key].contents()


def _dq(reader: GGUFReader, name: str) -> np.ndarray:
    t = next(x for x in reader.tensors if x.name == name)
    data = quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float64)
    return data.reshape(-1, int(t.shape[0])) if len(t.shape) > 1 else data.reshape(-1)


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope_ggml(x: np.ndarray, base: float, dim: int) -> np.ndarray:
    """GGML's llama rope: rotate adjacent pairs (x[2i], x[2i+1]) by pos * base^(-2i/dim)."""
    seq = x.shape[1]
    inv = base ** (-np.arange(0, dim, 2) / dim)
    ang = np.arange(seq)[:, None] * inv[None, :]  # [S, dim/2]
    cos, sin = np.cos(ang)[None, :, None, :], np.sin(ang)[None, :, None, :]
    x = x.reshape(*x.shape[:-1], dim // 2, 2)  # [1, S, H, dim/2, 2]
    a, b = x[..., 0], x[..., 1]
    return np.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(*x.shape[:-2], dim)


def numpy_logits(gguf_path: Path, ids: list[int]) -> np.ndarray:
    """Logits [len(ids), vocab] of the GGUF llama model on ``ids`` (one sequence, no cache)."""
    r = GGUFReader(str(gguf_path))
    a = _meta(r, "general.architecture")
    layers = _meta(r, f"{a}.block_count")
    heads = _meta(r, f"{a}.attention.head_count")
    kv_heads = _meta(r, f"{a}.attention.head_count_kv")
    eps = _meta(r, f"{a}.attention.layer_norm_rms_epsilon")
    base = _meta(r, f"{a}.rope.freq_base")
    embed = _dq(r, "token_embd.weight")
    names = {t.name for t in r.tensors}
    head_w = _dq(r, "output.weight") if "output.weight" in names else embed
    x = embed[np.asarray(ids)][None]  # [1, S, H]
    seq = x.shape[1]
    hd = x.shape[-1] // heads
    causal = np.triu(np.full((seq, seq), -np.inf), 1)
    for i in range(layers):
        p = f"blk.{i}."
        h = _rms(x, _dq(r, p + "attn_norm.weight"), eps)
        q = (h @ _dq(r, p + "attn_q.weight").T).reshape(1, seq, heads, hd)
        k = (h @ _dq(r, p + "attn_k.weight").T).reshape(1, seq, kv_heads, hd)
        v = (h @ _dq(r, p + "attn_v.weight").T).reshape(1, seq, kv_heads, hd)
        q, k = _rope_ggml(q, base, hd), _rope_ggml(k, base, hd)
        rep = heads // kv_heads
        k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
        scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd) + causal
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = scores / scores.sum(-1, keepdims=True)
        attn = np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(1, seq, heads * hd)
        x = x + attn @ _dq(r, p + "attn_output.weight").T
        h = _rms(x, _dq(r, p + "ffn_norm.weight"), eps)
        gate, up = h @ _dq(r, p + "ffn_gate.weight").T, h @ _dq(r, p + "ffn_up.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ _dq(r, p + "ffn_down.weight").T
    x = _rms(x, _dq(r, "output_norm.weight"), eps)
    return (x @ head_w.T)[0]


def matmul_nbits_run(blocks, x: np.ndarray) -> np.ndarray:
    """``x @ W.T`` for ``blocks`` (an importer ``Blocks``) through one onnxruntime MatMulNBits
    node at accuracy level 0 (fp32 activations), the zero points given when not symmetric."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    n, k = blocks.shape
    b, scales, zp = blocks.packed()
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales.reshape(n, -1), "S")]
    if not blocks.symmetric:
        inits.append(numpy_helper.from_array(zp.reshape(n, -1), "Z"))
    node = helper.make_node("MatMulNBits", ["A", "B", "S", "Z"][: len(inits) + 1], ["Y"],
                            domain="com.microsoft", K=k, N=n, bits=blocks.bits,
                            block_size=blocks.block, accuracy_level=0)  # fmt: skip
    graph = helper.make_graph(
        [node], "one", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [x.shape[0], k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [x.shape[0], n])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])  # fmt: skip
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"A": x})[0]
