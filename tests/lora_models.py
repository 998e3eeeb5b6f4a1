"""A tiny fp32 decoder with two LoRA sites, adapter files in onnxruntime's format, and a NumPy
reference over merged weights.

The decoder keeps each token's embedding in its one KV layer (as ``speculative_models``), so a
token's logits depend on the whole context:

    e_t = E[x_t]
    h_t = tanh(cumsum(e)_t @ P') + e_t
    logits_t = h_t @ W'

with ``P' = P + A_p @ B_p`` and ``W' = W + A_w @ B_w``. The four LoRA tensors are graph inputs
backed by zero initializers (what onnxruntime calls overridable initializers): without an
adapter the graph is the base model, and an adapter file overrides them by name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from tiny_models import save_graph

VOCAB = 32
DIM = 8
RANK = 2
LORA_SHAPES = {
    "lora.proj.A": (DIM, RANK),
    "lora.proj.B": (RANK, DIM),
    "lora.head.A": (DIM, RANK),
    "lora.head.B": (RANK, VOCAB),
}


def base_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "E": rng.normal(0, 1.0, (VOCAB, DIM)).astype(np.float32),
        "P": rng.normal(0, 0.5, (DIM, DIM)).astype(np.float32),
        "W": rng.normal(0, 1.0, (DIM, VOCAB)).astype(np.float32),
    }


def lora_weights(seed: int, scale: float = 0.5) -> dict[str, np.ndarray]:
    """Non-zero low-rank factors for every LoRA site (``scale`` folded in, as exporters do)."""
    rng = np.random.default_rng(seed)
    return {
        name: (scale * rng.normal(0, 1.0, shape)).astype(np.float32)
        for name, shape in LORA_SHAPES.items()
    }


def merged(base: Mapping[str, np.ndarray], lora: Mapping[str, np.ndarray] | None):
    """(E, P', W'): the base weights with the adapter's low-rank updates merged in."""
    p, w = base["P"].astype(np.float64), base["W"].astype(np.float64)
    if lora:
        p = p + lora["lora.proj.A"].astype(np.float64) @ lora["lora.proj.B"]
        w = w + lora["lora.head.A"].astype(np.float64) @ lora["lora.head.B"]
    return base["E"].astype(np.float64), p, w


def reference_logits(
    tokens: np.ndarray, base: Mapping[str, np.ndarray], lora: Mapping[str, np.ndarray] | None
) -> np.ndarray:
    """Logits [T, V] after every token of ``tokens`` [T], from merged weights, in float64."""
    emb, proj, head = merged(base, lora)
    e = emb[tokens]
    h = np.tanh(np.cumsum(e, axis=0) @ proj) + e
    return h @ head


def lora_decoder(path: Path, base: Mapping[str, np.ndarray], defaults: bool = True) -> Path:
    """``defaults=False``: the LoRA inputs have no initializer (nothing feeds them but an
    adapter)."""
    f = TensorProto.FLOAT
    kv = ["batch", 1, "past", DIM]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]),
        helper.make_tensor_value_info("past_key_values.0.key", f, kv),
        helper.make_tensor_value_info("past_key_values.0.value", f, kv),
        *(helper.make_tensor_value_info(n, f, list(s)) for n, s in LORA_SHAPES.items()),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", f, ["batch", "seq", VOCAB]),
        helper.make_tensor_value_info("present.0.key", f, ["batch", 1, "total", DIM]),
        helper.make_tensor_value_info("present.0.value", f, ["batch", 1, "total", DIM]),
    ]

    def lora_matmul(x: str, weight: str, site: str, out: str) -> list[onnx.NodeProto]:
        return [
            helper.make_node("MatMul", [x, weight], [f"{out}.base"]),
            helper.make_node("MatMul", [x, f"lora.{site}.A"], [f"{out}.a"]),
            helper.make_node("MatMul", [f"{out}.a", f"lora.{site}.B"], [f"{out}.ab"]),
            helper.make_node("Add", [f"{out}.base", f"{out}.ab"], [out]),
        ]

    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["e"]),
        helper.make_node("Unsqueeze", ["e", "one"], ["e4"]),
        helper.make_node("Concat", ["past_key_values.0.key", "e4"], ["present.0.key"], axis=2),
        helper.make_node("Concat", ["past_key_values.0.value", "e4"], ["present.0.value"], axis=2),
        helper.make_node("CumSum", ["present.0.key", "two_scalar"], ["running4"]),
        helper.make_node("Squeeze", ["running4", "one"], ["running"]),
        helper.make_node("Shape", ["input_ids"], ["ids_shape"]),
        helper.make_node("Gather", ["ids_shape", "one_scalar"], ["seq"]),
        helper.make_node("Neg", ["seq"], ["neg_seq"]),
        helper.make_node("Unsqueeze", ["neg_seq", "zero"], ["starts"]),
        helper.make_node("Slice", ["running", "starts", "big", "one"], ["last"]),
        *lora_matmul("last", "P", "proj", "projected"),
        helper.make_node("Tanh", ["projected"], ["squashed"]),
        helper.make_node("Add", ["squashed", "e"], ["hidden"]),
        *lora_matmul("hidden", "W", "head", "logits"),
    ]
    const = numpy_helper.from_array
    init = [
        const(base["E"], "E"),
        const(base["P"], "P"),
        const(base["W"], "W"),
        *(const(np.zeros(s, np.float32), n) for n, s in LORA_SHAPES.items() if defaults),
        const(np.array([1], np.int64), "one"),
        const(np.array(2, np.int64), "two_scalar"),  # CumSum axis (0-D)
        const(np.array([0], np.int64), "zero"),
        const(np.array(1, np.int64), "one_scalar"),
        const(np.array([2**62], np.int64), "big"),
    ]
    graph = helper.make_graph(nodes, "lora_decoder", inputs, outputs, initializer=init)
    return save_graph(graph, path)


def write_adapter(path: Path, tensors: Mapping[str, np.ndarray]) -> Path:
    """``tensors`` as an ``.onnx_adapter`` file, written by onnxruntime's own AdapterFormat."""
    adapter = ort.AdapterFormat()
    adapter.set_adapter_version(1)
    adapter.set_model_version(1)
    adapter.set_parameters(
        {
            name: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a))
            for name, a in tensors.items()
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    adapter.export_adapter(str(path))
    return path


def model_folder(
    folder: Path, base: Mapping[str, np.ndarray], max_length: int = 24, defaults: bool = True
) -> Path:
    """The decoder and a v1 genai_config.json both runtimes read (eos = VOCAB - 1, pad 0)."""
    lora_decoder(folder / "model.onnx", base, defaults)
    config = {
        "model": {
            "type": "llama",
            "vocab_size": VOCAB,
            "context_length": max_length,
            "bos_token_id": 1,
            "eos_token_id": VOCAB - 1,
            "pad_token_id": 0,
            "decoder": {
                "filename": "model.onnx",
                "head_size": DIM,
                "hidden_size": DIM,
                "num_attention_heads": 1,
                "num_key_value_heads": 1,
                "num_hidden_layers": 1,
                "session_options": {"provider_options": []},
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
            },
        },
        "search": {
            "max_length": max_length,
            "do_sample": False,
            "past_present_share_buffer": False,
        },
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "genai_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return folder


def word_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer.json over the decoder's vocabulary: ``<pad>``, ``<s>``, ``w2`` ..
    ``w30``, ``</s>``; generated ids read back from text (``w28w12`` -> 28, 12)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<s>", *(f"w{i}" for i in range(2, VOCAB - 1)), "</s>"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    return folder
