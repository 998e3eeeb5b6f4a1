"""Export transformers checkpoints as the Windows ML composite designs do: every shape fixed, the
past K/V fed in at a fixed context, only the new tokens' K/V returned (the runtime keeps the
cache and writes those rows), each folder with a v2 ``genai_config.json`` that extends a preset.

    python benchmarks/winml_export.py tiny OUT               # random-weight checkpoints + exports
    python benchmarks/winml_export.py compare OUT            # ... run against PyTorch's generate
    python benchmarks/winml_export.py t5 CHECKPOINT OUT [--source-len 16] [--ctx 16]
    python benchmarks/winml_export.py qwen3 CHECKPOINT OUT --cache sliding|static \
        [--chunk 8] [--ctx 24]
    python benchmarks/winml_export.py t5-small OUT [--source-len 64] [--ctx 64]  # bigger T5
    python benchmarks/winml_export.py providers SRC OUT --encoder openvino --decoder cpu
    python benchmarks/winml_export.py stages OUT   # each T5 folder's providers, against torch

What each export writes:

- ``t5``: ``encoder.onnx`` (``input_ids`` / ``attention_mask`` ``[B, S]`` at a fixed source length,
  out: each decoder layer's cross-attention K/V ``present_key_cross_%d`` ``[B, H, S, d_kv]``) and
  ``decoder.onnx`` (one token: ``input_ids [B, 1]``, a left-aligned ``attention_mask [B, ctx]``,
  ``encoder_attention_mask [B, S]``, ``cache_position [1]``, the self-attention past
  ``[B, H, ctx, d_kv]`` and the cross K/V; the graph index-copies the new row at
  ``cache_position`` and returns only ``present.%d.key`` ``[B, H, 1, d_kv]``).
- ``qwen3``: ``prefill.onnx`` (a chunk of ``C`` tokens) and ``decode.onnx`` (one token), both over
  a past fixed at ``ctx`` rows, with ``position_ids [B, C]`` for RoPE. ``--cache static`` adds
  ``cache_position [C]`` (the slots the chunk takes: index_copy, left-aligned mask,
  right-padded chunks); ``--cache sliding`` has none (the graph drops the oldest ``C`` rows and
  appends the chunk, Slice + Concat: a FIFO, right-aligned mask, left-padded chunks).

Per-stage execution providers: ``tiny`` and ``t5-small`` also write ``t5-static-openvino`` (the
encoder on the OpenVINO provider, CPU device; the decoder on the CPU provider) and
``t5-static-openvino-decoder`` (both on OpenVINO), the same graphs under another config
(``providers`` writes such a copy of any T5 folder), and ``t5-reference.npz``, PyTorch's greedy
tokens and logits for ``T5_PROMPTS``. ``stages`` needs only the runtime and numpy, so it runs in a
venv with onnxruntime-openvino and no torch: each folder's tokens and logits against PyTorch's
and the all-CPU folder's, decoder ms/step, encoder ms, and which provider took each stage's
nodes (a folder whose provider is missing reports the error).

The attention mask covers the graph's own buffer after it wrote the chunk (``[B, ctx]``), as the
designs' masks do. torch and transformers are needed here only; the runtime never imports them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

OPSET = 17
T5_SOURCE_LEN, T5_CTX = 16, 16
QWEN_CHUNK, QWEN_CTX = 8, 24
# Per-stage providers: folder -> (encoder provider, decoder provider); OpenVINO on its CPU device.
STAGE_FOLDERS = {
    "t5-static": ("cpu", "cpu"),
    "t5-static-openvino": ("openvino", "cpu"),
    "t5-static-openvino-decoder": ("openvino", "openvino"),
}
PROVIDER_OPTIONS = {"cpu": {}, "openvino": {"device_type": "CPU"}}
T5_PROMPTS = [[5, 9, 22], [7, 3, 40, 41, 12, 9, 88], [60, 2, 2, 14, 5]]
T5_STEPS = 14
REFERENCE = "t5-reference.npz"


# -- random-weight checkpoints -----------------------------------------------------------------


def _spread(model, seed: int) -> None:
    """Redraw the weights so a random model's logits are decisive (no near-ties for greedy):
    linear weights N(0, 1/fan_in), embeddings and position biases N(0, 1), norms 1."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.fill_(1.0)
            elif "embed" in name or "shared" in name or "relative_attention_bias" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))


def tiny_t5(out: Path, seed: int = 0, size: str = "tiny") -> Path:
    """A two-layer T5 (vocab 96) with random weights, saved with save_pretrained; ``size``
    ``small``: t5-small's shapes (6 + 6 layers, d_model 512, 8 heads, vocab 32128)."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    shapes = {
        "tiny": dict(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                     num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=8,
                     relative_attention_max_distance=20),
        "small": dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6,
                      num_decoder_layers=6, num_heads=8, relative_attention_num_buckets=32,
                      relative_attention_max_distance=128),
    }[size]  # fmt: skip
    cfg = T5Config(
        **shapes, dropout_rate=0.0, feed_forward_proj="relu", pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = T5ForConditionalGeneration(cfg).eval()
    _spread(model, seed)
    with torch.no_grad():  # T5 ties its output embedding to its input one (transformers 5)
        for name, p in model.named_parameters():
            if name.endswith((".o.weight", ".wo.weight")):
                p.mul_(4.0)  # sublayers outweigh the input token: not just a copy of it
        model.shared.weight.mul_(0.2)
        model.shared.weight[cfg.eos_token_id] = 0.0  # EOS rarely wins: runs go their length
    model.save_pretrained(out)
    return out


def tiny_qwen3(out: Path, window: int = QWEN_CTX, seed: int = 0) -> Path:
    """A two-layer Qwen3 (vocab 96, GQA 4/2, head_dim 16) whose layers all use a sliding window
    of ``window`` tokens, with random weights, saved with save_pretrained."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        use_sliding_window=True, sliding_window=window, max_window_layers=0,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).eval()
    _spread(model, seed)
    model.save_pretrained(out)
    return out


# -- the graphs ----------------------------------------------------------------------------------


def _modules():
    """The torch.nn wrappers, defined once torch is imported."""
    import torch
    from torch import nn

    def additive(allowed: torch.Tensor) -> torch.Tensor:
        # transformers' convention: the dtype's min where masked (no -inf, so no NaN rows).
        zero = torch.zeros((), dtype=torch.float32)
        return torch.where(allowed, zero, torch.finfo(torch.float32).min)

    def attend(q, k, v, bias):
        probs = torch.softmax(q @ k.transpose(-1, -2) + bias, dim=-1)
        return probs @ v

    class T5Encoder(nn.Module):
        """Source ids -> every decoder layer's cross-attention K/V."""

        def __init__(self, model):
            super().__init__()
            self.m = model
            self.heads, self.d_kv = model.config.num_heads, model.config.d_kv

        def forward(self, input_ids, attention_mask):
            enc, heads, d = self.m.encoder, self.heads, self.d_kv
            b, s = input_ids.shape
            x = self.m.shared(input_ids)
            bias = enc.block[0].layer[0].SelfAttention.compute_bias(s, s)
            bias = bias + additive(attention_mask[:, None, None, :] > 0)
            for block in enc.block:
                att = block.layer[0].SelfAttention
                h = block.layer[0].layer_norm(x)
                q, k, v = (f(h).view(b, s, heads, d).transpose(1, 2) for f in (att.q, att.k, att.v))
                o = attend(q, k, v, bias).transpose(1, 2).reshape(b, s, heads * d)
                x = block.layer[-1](x + att.o(o))
            x = enc.final_layer_norm(x)
            out = []
            for block in self.m.decoder.block:
                cross = block.layer[1].EncDecAttention
                for f in (cross.k, cross.v):
                    out.append(f(x).view(b, s, heads, d).transpose(1, 2))
            return tuple(out)

    class T5Decoder(nn.Module):
        """One token over the static cache: index_copy at ``cache_position``, new K/V out."""

        def __init__(self, model):
            super().__init__()
            self.m = model
            self.heads, self.d_kv = model.config.num_heads, model.config.d_kv
            self.layers = len(model.decoder.block)
            cfg = model.config
            self.scale = getattr(cfg, "scale_decoder_outputs", cfg.tie_word_embeddings)

        def forward(self, input_ids, attention_mask, encoder_attention_mask, cache_position,
                    *caches):  # fmt: skip
            dec, heads, d, n = self.m.decoder, self.heads, self.d_kv, self.layers
            past, cross = caches[: 2 * n], caches[2 * n :]
            b, c = input_ids.shape
            ctx = past[0].shape[2]
            x = self.m.shared(input_ids)
            att0 = dec.block[0].layer[0].SelfAttention
            slots = torch.arange(ctx, dtype=torch.long)
            rel = slots[None, :] - cache_position[:, None]  # [C, ctx]
            buckets = att0._relative_position_bucket(
                rel, bidirectional=False, num_buckets=att0.relative_attention_num_buckets,
                max_distance=att0.relative_attention_max_distance,
            )  # fmt: skip
            bias = att0.relative_attention_bias(buckets).permute(2, 0, 1)[None]  # [1,H,C,ctx]
            allowed = (attention_mask[:, None, None, :] > 0) & (rel <= 0)[None, None]
            bias = bias + additive(allowed)
            cross_bias = additive(encoder_attention_mask[:, None, None, :] > 0)
            presents = []
            for i, block in enumerate(dec.block):
                att = block.layer[0].SelfAttention
                h = block.layer[0].layer_norm(x)
                q, k, v = (f(h).view(b, c, heads, d).transpose(1, 2) for f in (att.q, att.k, att.v))
                keys = past[2 * i].index_copy(2, cache_position, k)
                values = past[2 * i + 1].index_copy(2, cache_position, v)
                presents += [keys.index_select(2, cache_position),
                             values.index_select(2, cache_position)]  # fmt: skip
                o = attend(q, keys, values, bias).transpose(1, 2).reshape(b, c, heads * d)
                x = x + att.o(o)
                ca = block.layer[1].EncDecAttention
                q = ca.q(block.layer[1].layer_norm(x)).view(b, c, heads, d).transpose(1, 2)
                o = attend(q, cross[2 * i], cross[2 * i + 1], cross_bias)
                x = x + ca.o(o.transpose(1, 2).reshape(b, c, heads * d))
                x = block.layer[-1](x)
            x = dec.final_layer_norm(x)
            if self.scale:
                x = x * (self.m.model_dim**-0.5)
            return (self.m.lm_head(x), *presents)

    class Qwen3Chunk(nn.Module):
        """A fixed chunk over a fixed past; ``static``: index_copy at ``cache_position`` and a
        left-aligned mask; else Slice + Concat (drop the oldest C rows) and a right-aligned one."""

        def __init__(self, model, static: bool):
            super().__init__()
            self.m, self.static = model, static
            cfg = model.config
            self.heads, self.kv_heads, self.d = (
                cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
            )  # fmt: skip

        def forward(self, input_ids, attention_mask, position_ids, *rest):
            if self.static:
                cache_position, past = rest[0], rest[1:]
            else:
                cache_position, past = None, rest
            from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

            inner, heads, kvh, d = self.m.model, self.heads, self.kv_heads, self.d
            b, c = input_ids.shape
            ctx = past[0].shape[2]
            x = inner.embed_tokens(input_ids)
            cos, sin = inner.rotary_emb(x, position_ids)
            slots = torch.arange(ctx, dtype=torch.long)
            if self.static:
                query_slots = cache_position
            else:
                query_slots = torch.arange(ctx - c, ctx, dtype=torch.long)
            causal = slots[None, :] <= query_slots[:, None]  # [C, ctx]
            bias = additive((attention_mask[:, None, None, :] > 0) & causal[None, None])
            presents = []
            for i, layer in enumerate(inner.layers):
                att = layer.self_attn
                h = layer.input_layernorm(x)
                q = att.q_norm(att.q_proj(h).view(b, c, heads, d)).transpose(1, 2)
                k = att.k_norm(att.k_proj(h).view(b, c, kvh, d)).transpose(1, 2)
                v = att.v_proj(h).view(b, c, kvh, d).transpose(1, 2)
                q, k = apply_rotary_pos_emb(q, k, cos, sin)
                if self.static:
                    keys = past[2 * i].index_copy(2, cache_position, k)
                    values = past[2 * i + 1].index_copy(2, cache_position, v)
                else:
                    keys = torch.cat([past[2 * i][:, :, c:], k], dim=2)
                    values = torch.cat([past[2 * i + 1][:, :, c:], v], dim=2)
                presents += [k, v]
                group = heads // kvh
                keys = keys.repeat_interleave(group, dim=1)
                values = values.repeat_interleave(group, dim=1)
                o = attend(q * att.scaling, keys, values, bias)
                x = x + att.o_proj(o.transpose(1, 2).reshape(b, c, heads * d))
                x = x + layer.mlp(layer.post_attention_layernorm(x))
            return (self.m.lm_head(inner.norm(x)), *presents)

    return T5Encoder, T5Decoder, Qwen3Chunk


def _export(module, args: tuple, path: Path, inputs: list[str], outputs: list[str]) -> None:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, args, str(path), input_names=inputs, output_names=outputs,
            opset_version=OPSET, dynamo=False, do_constant_folding=True,
        )  # fmt: skip


def _session(file: str, provider: str) -> dict:
    """A v2 session entry on ``provider`` (the CPU's: no provider_options, the default)."""
    if provider not in PROVIDER_OPTIONS:
        raise ValueError(f"provider must be one of {', '.join(PROVIDER_OPTIONS)}, not {provider!r}")
    if provider == "cpu":
        return {"file": file}
    options = [{provider: PROVIDER_OPTIONS[provider]}]
    return {"file": file, "session_options": {"provider_options": options}}


def with_providers(src: Path, out: Path, encoder: str, decoder: str) -> Path:
    """A copy of the T5 folder ``src`` (graphs hard-linked where the filesystem allows) whose
    encoder and decoder sessions run on the named providers."""
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    for graph in src.glob("*.onnx*"):
        target = out / graph.name
        target.unlink(missing_ok=True)
        try:
            target.hardlink_to(graph)
        except OSError:
            shutil.copyfile(graph, target)
    doc = json.loads((src / "genai_config.json").read_text(encoding="utf-8"))
    sessions = doc["pipeline"]["sessions"]
    for name, provider in (("encoder", encoder), ("decoder", decoder)):
        sessions[name] = _session(sessions[name]["file"], provider)
    _write_config(out, doc)
    return out


def _write_config(out: Path, doc: dict) -> None:
    (out / "genai_config.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def export_t5(
    checkpoint: Path,
    out: Path,
    source_len: int = T5_SOURCE_LEN,
    ctx: int = T5_CTX,
    batch: int = 1,
    encoder_provider: str = "cpu",
    decoder_provider: str = "cpu",
) -> Path:
    """encoder.onnx + decoder.onnx + genai_config.json (preset encoder-decoder), every shape
    fixed (``batch`` rows included); each session on its provider (``PROVIDER_OPTIONS``)."""
    import torch
    from transformers import T5ForConditionalGeneration

    T5Encoder, T5Decoder, _ = _modules()
    model = T5ForConditionalGeneration.from_pretrained(checkpoint).eval()
    cfg = model.config
    out.mkdir(parents=True, exist_ok=True)
    b, heads, d, n = batch, cfg.num_heads, cfg.d_kv, cfg.num_decoder_layers
    ids = torch.ones((b, source_len), dtype=torch.long)
    cross_names = [f"present_{kind}_cross_{i}" for i in range(n) for kind in ("key", "value")]
    with torch.no_grad():
        _export(T5Encoder(model), (ids, torch.ones_like(ids)), out / "encoder.onnx",
                ["input_ids", "attention_mask"], cross_names)  # fmt: skip
    past = [torch.zeros(b, heads, ctx, d) for _ in range(2 * n)]
    cross = [torch.zeros(b, heads, source_len, d) for _ in range(2 * n)]
    names = ["input_ids", "attention_mask", "encoder_attention_mask", "cache_position"]
    names += [f"past_key_values.{i}.{kind}" for i in range(n) for kind in ("key", "value")]
    names += [f"past_{kind}_cross_{i}" for i in range(n) for kind in ("key", "value")]
    presents = [f"present.{i}.{kind}" for i in range(n) for kind in ("key", "value")]
    args = (
        torch.zeros((b, 1), dtype=torch.long), torch.ones((b, ctx), dtype=torch.long),
        torch.ones((b, source_len), dtype=torch.long), torch.zeros(1, dtype=torch.long),
        *past, *cross,
    )  # fmt: skip
    with torch.no_grad():
        _export(T5Decoder(model), args, out / "decoder.onnx", names, ["logits", *presents])
    eos = cfg.eos_token_id
    _write_config(out, {
        "version": 2,
        "pipeline": {
            "extends": "encoder-decoder",
            "sessions": {"encoder": _session("encoder.onnx", encoder_provider),
                         "decoder": _session("decoder.onnx", decoder_provider)},
            "dataflow": [],
            "state": {"kv_cache": {"past_key_pattern": "past_key_values.%d.key",
                                   "past_value_pattern": "past_key_values.%d.value",
                                   "present_key_pattern": "present.%d.key",
                                   "present_value_pattern": "present.%d.value"}},
        },
        "tokens": {"bos": cfg.decoder_start_token_id, "eos": [eos], "pad": cfg.pad_token_id,
                   "decoder_start": cfg.decoder_start_token_id},
        "generation": {"max_length": source_len + ctx, "do_sample": False, "batch_size": b},
        "metadata": {"model_type": "t5", "exported_by": "benchmarks/winml_export.py",
                     "cache": "static (index_copy at cache_position)"},
    })  # fmt: skip
    return out


def export_qwen3(
    checkpoint: Path, out: Path, cache: str, chunk: int = QWEN_CHUNK, ctx: int = QWEN_CTX
) -> Path:
    """prefill.onnx (a chunk) + decode.onnx (one token) + genai_config.json (preset
    prefill-decode); ``cache`` is ``static`` or ``sliding``."""
    import torch
    from transformers import Qwen3ForCausalLM

    if cache not in ("static", "sliding"):
        raise ValueError(f"cache must be static or sliding, not {cache!r}")
    _, _, Qwen3Chunk = _modules()
    model = Qwen3ForCausalLM.from_pretrained(checkpoint).eval()
    cfg = model.config
    out.mkdir(parents=True, exist_ok=True)
    static = cache == "static"
    n, kvh, d = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
    past_names = [f"past_key_values.{i}.{kind}" for i in range(n) for kind in ("key", "value")]
    presents = [f"present.{i}.{kind}" for i in range(n) for kind in ("key", "value")]
    for file, c in (("prefill.onnx", chunk), ("decode.onnx", 1)):
        names = ["input_ids", "attention_mask", "position_ids"]
        args = [torch.zeros((1, c), dtype=torch.long), torch.ones((1, ctx), dtype=torch.long),
                torch.arange(c, dtype=torch.long)[None]]  # fmt: skip
        if static:
            names.append("cache_position")
            args.append(torch.arange(c, dtype=torch.long))
        args += [torch.zeros(1, kvh, ctx, d) for _ in range(2 * n)]
        with torch.no_grad():
            _export(Qwen3Chunk(model, static), tuple(args), out / file, names + past_names,
                    ["logits", *presents])  # fmt: skip
    how = ("index_copy at cache_position, left-aligned mask, right-padded chunks" if static
           else "FIFO Slice + Concat, right-aligned mask, left-padded chunks")  # fmt: skip
    eos = cfg.eos_token_id
    _write_config(out, {
        "version": 2,
        "pipeline": {"extends": "prefill-decode"},
        "tokens": {"bos": cfg.bos_token_id, "eos": [eos] if isinstance(eos, int) else eos,
                   "pad": cfg.pad_token_id},
        "generation": {"max_length": ctx if static else 4 * ctx, "do_sample": False},
        "metadata": {"model_type": "qwen3", "exported_by": "benchmarks/winml_export.py",
                     "cache": f"{cache} ({how})"},
    })  # fmt: skip
    return out


def tiny_exports(root: Path) -> dict[str, Path]:
    """The random-weight checkpoints and the three exports under ``root``."""
    t5 = tiny_t5(root / "checkpoint-t5")
    qwen = tiny_qwen3(root / "checkpoint-qwen3")
    out = {
        "checkpoint-t5": t5,
        "checkpoint-qwen3": qwen,
        "t5-static": export_t5(t5, root / "t5-static"),
        "t5-static-batch2": export_t5(t5, root / "t5-static-batch2", batch=2),
        "qwen3-static": export_qwen3(qwen, root / "qwen3-static", "static"),
        "qwen3-sliding": export_qwen3(qwen, root / "qwen3-sliding", "sliding"),
    }
    for name, (encoder, decoder) in STAGE_FOLDERS.items():
        if name not in out:
            out[name] = with_providers(out["t5-static"], root / name, encoder, decoder)
    return out


def t5_small(root: Path, source_len: int = 64, ctx: int = 64) -> dict[str, Path]:
    """A random-weight checkpoint of t5-small's shapes, its static export and the provider
    copies (``STAGE_FOLDERS``) under ``root``."""
    t5 = tiny_t5(root / "checkpoint-t5", size="small")
    out = {"checkpoint-t5": t5, "t5-static": export_t5(t5, root / "t5-static", source_len, ctx)}
    for name, (encoder, decoder) in STAGE_FOLDERS.items():
        if name not in out:
            out[name] = with_providers(out["t5-static"], root / name, encoder, decoder)
    return out


def small_prompts(vocab: int, source_len: int) -> list[list[int]]:
    """Three prompts of random ids (2..vocab-1) that fit ``source_len`` with their EOS."""
    import numpy as np

    rng = np.random.default_rng(7)
    lengths = [10, source_len // 2, source_len - 1]
    return [rng.integers(2, vocab, n).tolist() for n in lengths]


def write_t5_reference(root: Path, prompts: list[list[int]], steps: int) -> Path:
    """PyTorch's greedy tokens and per-step logits for each prompt (batch 1; source = prompt +
    EOS, as the runtime feeds the encoder), as ``root/t5-reference.npz``."""
    import numpy as np
    import torch
    from transformers import T5ForConditionalGeneration

    model = T5ForConditionalGeneration.from_pretrained(root / "checkpoint-t5").eval()
    eos = model.config.eos_token_id
    arrays: dict[str, np.ndarray] = {"steps": np.array(steps)}
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            ref = model.generate(
                torch.tensor([[*prompt, eos]]), max_new_tokens=steps, do_sample=False,
                output_logits=True, return_dict_in_generate=True,
            )  # fmt: skip
        arrays[f"prompt{i}"] = np.array(prompt, np.int64)
        arrays[f"tokens{i}"] = ref.sequences[0, 1:].numpy()  # theirs starts with the start id
        arrays[f"logits{i}"] = torch.cat(ref.logits).numpy()  # [steps, V]
    path = root / REFERENCE
    np.savez(path, **arrays)
    return path


def read_t5_reference(root: Path) -> tuple[list[list[int]], int, list[list[int]], list]:
    """``write_t5_reference``'s prompts, steps, tokens and logits."""
    import numpy as np

    with np.load(root / REFERENCE) as data:
        count = sum(1 for key in data.files if key.startswith("prompt"))
        prompts = [data[f"prompt{i}"].tolist() for i in range(count)]
        tokens = [data[f"tokens{i}"].tolist() for i in range(count)]
        logits = [data[f"logits{i}"] for i in range(count)]
        return prompts, int(data["steps"]), tokens, logits


def stage_providers(model) -> dict[str, str]:
    """Each session's providers as ``explain`` shows them (the nodes each took)."""
    from genai_runtime.explain import providers_text, session_providers

    return {name: providers_text(session_providers(s)) for name, s in model.sessions.items()}


def _encoder_ms(model, repeats: int = 20) -> float:
    """Median ms of one encoder run (the fixed-shape graph on its provider, ones as inputs)."""
    import statistics
    import time

    import numpy as np

    session = model.sessions["encoder"]
    feeds = {i.name: np.ones(i.shape, np.int64) for i in session.get_inputs()}
    session.run(None, feeds)  # warm-up
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - begin)
    return 1e3 * statistics.median(times)


def stages(root: Path, folders: list[str] | None = None) -> list[dict]:
    """Each T5 provider folder under ``root`` (``STAGE_FOLDERS``) on ``write_t5_reference``'s
    prompts: tokens and logits against PyTorch's and the all-CPU folder's, decoder ms/step
    (median over the prompts), encoder ms, and where each stage's nodes ran."""
    import statistics

    import numpy as np

    import genai_runtime as og

    prompts, steps, ref_tokens, ref_logits = read_t5_reference(root)
    rows, cpu = [], None
    for name in folders or list(STAGE_FOLDERS):
        row: dict = {"folder": name}
        try:
            model = og.Model(str(root / name))
        except og.GenaiRuntimeError as exc:
            rows.append({**row, "error": f"{type(exc).__name__}: {exc}"})
            continue
        row["providers"] = stage_providers(model)
        runs = [_ours(root / name, [p], steps, 2 * steps + len(p) + 2, model) for p in prompts]
        tokens = [run[0][0] for run in runs]
        logits = [np.concatenate(run[1]) for run in runs]  # [steps, V] per prompt
        if cpu is None:
            cpu = (tokens, logits)
        row.update({
            "tokens_equal_torch": tokens == ref_tokens,
            "tokens_equal_cpu": tokens == cpu[0],
            "max_abs_logit_diff_torch": _max_diff(logits, ref_logits),
            "max_abs_logit_diff_cpu": _max_diff(logits, cpu[1]),
            "decoder_ms_per_step": 1e3 * statistics.median(run[2] for run in runs),
            "encoder_ms": _encoder_ms(model),
        })  # fmt: skip
        rows.append(row)
    return rows


def _max_diff(ours: list, theirs: list) -> float:
    diffs = []
    for a, b in zip(ours, theirs):
        n = min(len(a), len(b))  # a run that ended early (EOS) has fewer steps
        diffs.append(float(abs(a[:n] - b[:n]).max()))
    return max(diffs)


def _ours(folder: Path, prompts: list[list[int]], steps: int, max_length: int, model=None):
    """Greedy tokens, per-step logits [B, V] and seconds per step (after the prompt)."""
    import time

    import numpy as np

    import genai_runtime as og

    model = model or og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, do_sample=False, batch_size=len(prompts))
    gen = og.Generator(model, params)
    width = max(map(len, prompts))
    gen.append_tokens(np.array([p + [0] * (width - len(p)) for p in prompts], np.int64))
    logits = [gen.get_logits()[:, 0].copy()]
    start = time.perf_counter()
    for _ in range(steps - 1):
        gen.generate_next_token()
        logits.append(gen.get_logits()[:, 0].copy())
    per_step = (time.perf_counter() - start) / max(steps - 1, 1)
    gen.generate_next_token()
    return [gen.get_sequence(b)[width:].tolist() for b in range(len(prompts))], logits, per_step


def compare(root: Path) -> list[dict]:
    """Each tiny export (``tiny ROOT``) against PyTorch's own greedy ``generate``."""
    import time

    import numpy as np
    import torch
    from transformers import Qwen3ForCausalLM, T5ForConditionalGeneration

    t5 = T5ForConditionalGeneration.from_pretrained(root / "checkpoint-t5").eval()
    qwen = Qwen3ForCausalLM.from_pretrained(root / "checkpoint-qwen3", attn_implementation="eager")
    cases = [("t5-static", [[5, 9, 22]], 14), ("t5-static-batch2", [[5, 9, 22], [7, 3, 40]], 14)]
    for cache, total in (("static", QWEN_CTX), ("sliding", 40)):
        for prompt in ([5, 17, 33], [5, 17, 33, 8, 60, 11, 42, 9, 70, 3, 21]):
            cases.append((f"qwen3-{cache}", [prompt], total - len(prompt)))
    rows = []
    for name, prompts, steps in cases:
        tokens, logits, ours_s = _ours(root / name, prompts, steps, 64)
        width = max(map(len, prompts))
        with torch.no_grad():
            begin = time.perf_counter()
            if name.startswith("t5"):
                src = [p + [1] + [0] * (width - len(p)) for p in prompts]
                mask = [[1] * (len(p) + 1) + [0] * (width - len(p)) for p in prompts]
                ref = t5.eval().generate(
                    torch.tensor(src), attention_mask=torch.tensor(mask), max_new_tokens=steps,
                    do_sample=False, output_logits=True, return_dict_in_generate=True,
                )  # fmt: skip
                theirs = [row[1:] for row in ref.sequences.tolist()]
            else:
                ref = qwen.eval().generate(
                    torch.tensor(prompts), max_new_tokens=steps, do_sample=False,
                    output_logits=True, return_dict_in_generate=True,
                )  # fmt: skip
                theirs = [row[width:] for row in ref.sequences.tolist()]
            torch_s = (time.perf_counter() - begin) / steps
        diff = max(float(np.abs(a - b.numpy()).max()) for a, b in zip(logits, ref.logits))
        rows.append({
            "export": name, "prompt_lengths": [len(p) for p in prompts], "steps": steps,
            "tokens_equal": tokens == theirs, "max_abs_logit_diff": diff,
            "ours_ms_per_step": 1e3 * ours_s, "torch_ms_per_step": 1e3 * torch_s,
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("tiny", help="random-weight T5 and Qwen3 checkpoints and their exports")
    p.add_argument("out", type=Path)
    p = sub.add_parser("t5", help="T5 encoder + decoder with the static cache")
    p.add_argument("checkpoint", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--source-len", type=int, default=T5_SOURCE_LEN)
    p.add_argument("--ctx", type=int, default=T5_CTX)
    p.add_argument("--batch", type=int, default=1)
    p = sub.add_parser("qwen3", help="Qwen3 prefill + decode graphs")
    p.add_argument("checkpoint", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--cache", choices=("static", "sliding"), required=True)
    p.add_argument("--chunk", type=int, default=QWEN_CHUNK)
    p.add_argument("--ctx", type=int, default=QWEN_CTX)
    for flag in ("--encoder-provider", "--decoder-provider"):
        p.add_argument(flag, choices=tuple(PROVIDER_OPTIONS), default="cpu")
    p = sub.add_parser("compare", help="run the tiny exports against PyTorch's generate")
    p.add_argument("root", type=Path)
    p = sub.add_parser("t5-small", help="a random T5 of t5-small's shapes, exported (benchmark)")
    p.add_argument("out", type=Path)
    p.add_argument("--source-len", type=int, default=64)
    p.add_argument("--ctx", type=int, default=64)
    p = sub.add_parser("providers", help="copy a T5 folder with each stage on a provider")
    p.add_argument("src", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--encoder", choices=tuple(PROVIDER_OPTIONS), default="cpu")
    p.add_argument("--decoder", choices=tuple(PROVIDER_OPTIONS), default="cpu")
    p = sub.add_parser("stages", help="each T5 provider folder against PyTorch and all-CPU")
    p.add_argument("root", type=Path)
    p.add_argument("--folders", nargs="+", choices=tuple(STAGE_FOLDERS))
    args = ap.parse_args(argv)
    if args.cmd == "compare":
        for row in compare(args.root):
            print(json.dumps(row))
    elif args.cmd == "tiny":
        for name, path in tiny_exports(args.out).items():
            print(f"{name}: {path}")
        print(f"reference: {write_t5_reference(args.out, T5_PROMPTS, T5_STEPS)}")
    elif args.cmd == "t5-small":
        for name, path in t5_small(args.out, args.source_len, args.ctx).items():
            print(f"{name}: {path}")
        prompts = small_prompts(32128, args.source_len)
        print(f"reference: {write_t5_reference(args.out, prompts, args.ctx - 2)}")
    elif args.cmd == "providers":
        print(with_providers(args.src, args.out, args.encoder, args.decoder))
    elif args.cmd == "stages":
        for row in stages(args.root, args.folders):
            print(json.dumps(row))
    elif args.cmd == "t5":
        print(export_t5(args.checkpoint, args.out, args.source_len, args.ctx, args.batch,
                        args.encoder_provider, args.decoder_provider))  # fmt: skip
    else:
        print(export_qwen3(args.checkpoint, args.out, args.cache, args.chunk, args.ctx))
    return 0


if __name__ == "__main__":
    sys.exit(main())
