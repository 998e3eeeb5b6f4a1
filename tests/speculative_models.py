"""Tiny fp32 decoders whose next token depends on the whole context, with a NumPy reference.

``context_decoder``: one KV layer holding the token embeddings; the hidden state at position t is
the running sum of embeddings up to t (CumSum over the concatenated cache), and
``logits_t = (tanh(sum_t) + e_t) @ W``. A pass over several tokens gives each position the sum up
to itself, so a batched verify pass computes what one-token passes compute. ``hidden_states``
is the running sum, which an MTP-style head (``mtp_head``) can extend exactly:
``sum_{t+1} = sum_t + E[x_{t+1}]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 21
IR_VERSION = 10
VOCAB = 32
DIM = 8


def weights(seed: int, noise: float = 0.0, base_seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Embedding E [V, D] and head W [D, V]; ``noise`` perturbs the ``base_seed`` weights."""
    rng = np.random.default_rng(base_seed)
    emb = rng.normal(0, 1.0, (VOCAB, DIM)).astype(np.float32)
    head = rng.normal(0, 2.0, (DIM, VOCAB)).astype(np.float32)
    if noise:
        other = np.random.default_rng(seed)
        emb = emb + noise * other.normal(0, 1.0, emb.shape).astype(np.float32)
        head = head + noise * other.normal(0, 2.0, head.shape).astype(np.float32)
    return emb, head


def reference_logits(tokens: np.ndarray, emb: np.ndarray, head: np.ndarray) -> np.ndarray:
    """Logits [T, V] after every token of ``tokens`` [T], as the graph computes them."""
    e = emb[tokens]
    running = np.cumsum(e, axis=0, dtype=np.float32)
    return (np.tanh(running) + e) @ head


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def context_decoder(path: Path, emb: np.ndarray, head: np.ndarray, *, logits_rank: int = 3) -> Path:
    f = TensorProto.FLOAT
    kv = ["batch", 1, "past", DIM]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]),
        helper.make_tensor_value_info("past_key_values.0.key", f, kv),
        helper.make_tensor_value_info("past_key_values.0.value", f, kv),
    ]
    vocab = head.shape[1]
    logits_shape = ["batch", "seq", vocab] if logits_rank == 3 else ["batch", vocab]
    outputs = [
        helper.make_tensor_value_info("logits", f, logits_shape),
        helper.make_tensor_value_info("hidden_states", f, ["batch", "seq", DIM]),
        helper.make_tensor_value_info("present.0.key", f, ["batch", 1, "total", DIM]),
        helper.make_tensor_value_info("present.0.value", f, ["batch", 1, "total", DIM]),
    ]
    const = numpy_helper.from_array
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["e"]),
        helper.make_node("Unsqueeze", ["e", "one"], ["e4"]),
        helper.make_node("Concat", ["past_key_values.0.key", "e4"], ["present.0.key"], axis=2),
        helper.make_node("Concat", ["past_key_values.0.value", "e4"], ["present.0.value"], axis=2),
        helper.make_node("CumSum", ["present.0.key", "two_scalar"], ["running"]),
        helper.make_node("Shape", ["input_ids"], ["ids_shape"]),
        helper.make_node("Gather", ["ids_shape", "one_scalar"], ["seq"]),
        helper.make_node("Neg", ["seq"], ["neg_seq"]),
        helper.make_node("Unsqueeze", ["neg_seq", "zero"], ["starts"]),
        helper.make_node("Slice", ["running", "starts", "big", "two"], ["last"]),
        helper.make_node("Squeeze", ["last", "one"], ["hidden_states"]),
        helper.make_node("Tanh", ["hidden_states"], ["squashed"]),
        helper.make_node("Add", ["squashed", "e"], ["mixed"]),
        helper.make_node("MatMul", ["mixed", "W"], ["all_logits"]),
    ]
    if logits_rank == 3:
        nodes.append(helper.make_node("Identity", ["all_logits"], ["logits"]))
    else:
        nodes.append(helper.make_node("Gather", ["all_logits", "minus_one"], ["logits"], axis=1))
    init = [
        const(emb, "E"),
        const(head, "W"),
        const(np.array([1], np.int64), "one"),
        const(np.array([2], np.int64), "two"),  # Slice axes
        const(np.array(2, np.int64), "two_scalar"),  # CumSum axis (0-D)
        const(np.array([0], np.int64), "zero"),
        const(np.array(1, np.int64), "one_scalar"),
        const(np.array(-1, np.int64), "minus_one"),
        const(np.array([2**62], np.int64), "big"),
    ]
    graph = helper.make_graph(nodes, "context_decoder", inputs, outputs, initializer=init)
    return _save(graph, path)


def mtp_head(path: Path, emb: np.ndarray, head: np.ndarray) -> Path:
    """input_ids [B, 1] + prev_hidden [B, 1, D] -> logits [B, 1, V], next_hidden [B, 1, D]."""
    f = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", 1]),
        helper.make_tensor_value_info("prev_hidden", f, ["batch", 1, DIM]),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", f, ["batch", 1, head.shape[1]]),
        helper.make_tensor_value_info("next_hidden", f, ["batch", 1, DIM]),
    ]
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["e"]),
        helper.make_node("Add", ["prev_hidden", "e"], ["next_hidden"]),
        helper.make_node("Tanh", ["next_hidden"], ["squashed"]),
        helper.make_node("Add", ["squashed", "e"], ["mixed"]),
        helper.make_node("MatMul", ["mixed", "W"], ["logits"]),
    ]
    init = [numpy_helper.from_array(emb, "E"), numpy_helper.from_array(head, "W")]
    graph = helper.make_graph(nodes, "mtp_head", inputs, outputs, initializer=init)
    return _save(graph, path)


def write_config(folder: Path, doc: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "genai_config.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return folder


def decoder_config(max_length: int = 48, **pipeline: Any) -> dict[str, Any]:
    """A v2 config for ``model.onnx`` (eos = VOCAB - 1, pad 0) plus extra pipeline keys."""
    return {
        "version": 2,
        "pipeline": {
            "sessions": {"decoder": {"file": "model.onnx"}},
            "flow": [{"run": "decoder", "when": "step"}],
            **pipeline,
        },
        "tokens": {"bos": 1, "eos": [VOCAB - 1], "pad": 0},
        "generation": {"max_length": max_length},
    }


def positions_table(seed: int = 7, rows: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1.0, (rows, DIM)).astype(np.float32)


def tree_reference_logits(
    tokens: np.ndarray, emb: np.ndarray, head: np.ndarray, pos: np.ndarray
) -> np.ndarray:
    """Logits [T, V] of ``tree_decoder`` after every token of a linear sequence."""
    e = emb[tokens] + pos[np.arange(len(tokens))]
    return (np.tanh(np.cumsum(e, axis=0, dtype=np.float32)) + e) @ head


def tree_decoder(path: Path, emb: np.ndarray, head: np.ndarray, pos: np.ndarray) -> Path:
    """``context_decoder`` with attention a token tree can use: a 4D ``attention_mask``
    [B, 1, S, T] (1 = attend) selects which cached rows each new token sums, and
    ``position_ids`` add a position embedding, so both a wrong mask and a wrong position show.
    """
    f = TensorProto.FLOAT
    kv = ["batch", 1, "past", DIM]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info(
            "attention_mask", TensorProto.INT64, ["batch", 1, "seq", "total"]
        ),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("past_key_values.0.key", f, kv),
        helper.make_tensor_value_info("past_key_values.0.value", f, kv),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", f, ["batch", "seq", head.shape[1]]),
        helper.make_tensor_value_info("hidden_states", f, ["batch", "seq", DIM]),
        helper.make_tensor_value_info("present.0.key", f, ["batch", 1, "total", DIM]),
        helper.make_tensor_value_info("present.0.value", f, ["batch", 1, "total", DIM]),
    ]
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["tok"]),
        helper.make_node("Gather", ["P", "position_ids"], ["at"]),
        helper.make_node("Add", ["tok", "at"], ["e"]),
        helper.make_node("Unsqueeze", ["e", "one"], ["e4"]),
        helper.make_node("Concat", ["past_key_values.0.key", "e4"], ["present.0.key"], axis=2),
        helper.make_node("Concat", ["past_key_values.0.value", "e4"], ["present.0.value"], axis=2),
        helper.make_node("Cast", ["attention_mask"], ["weights"], to=f),
        helper.make_node("MatMul", ["weights", "present.0.value"], ["summed"]),  # [B,1,S,D]
        helper.make_node("Squeeze", ["summed", "one"], ["hidden_states"]),
        helper.make_node("Tanh", ["hidden_states"], ["squashed"]),
        helper.make_node("Add", ["squashed", "e"], ["mixed"]),
        helper.make_node("MatMul", ["mixed", "W"], ["logits"]),
    ]
    init = [
        numpy_helper.from_array(emb, "E"),
        numpy_helper.from_array(head, "W"),
        numpy_helper.from_array(pos, "P"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
    ]
    graph = helper.make_graph(nodes, "tree_decoder", inputs, outputs, initializer=init)
    return _save(graph, path)
