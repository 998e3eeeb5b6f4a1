"""Tiny ONNX graphs for tests, built with ``onnx.helper`` and written where the test says.

The graphs only need the right declared inputs and outputs (names, dtypes, ranks, static KV
dims): they are loaded by onnxruntime and introspected, rarely run. Each builder writes one
``.onnx`` file and returns its path. Write into pytest's ``tmp_path``, never into the repo.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 21
# onnx 1.23 stamps IR 14 by default, which onnxruntime 1.31 refuses; 10 covers opset <= 22.
IR_VERSION = 10

FLOAT = TensorProto.FLOAT
FLOAT16 = TensorProto.FLOAT16
INT64 = TensorProto.INT64

VOCAB = 16
HIDDEN = 8
HEADS = 2
HEAD_SIZE = 4

Dims = Sequence[int | str]
# (past key, past value, present key, present value) name patterns; %d is the layer index.
KVPatterns = tuple[str, str, str, str]
DEFAULT_KV: KVPatterns = (
    "past_key_values.%d.key",
    "past_key_values.%d.value",
    "present.%d.key",
    "present.%d.value",
)


def save_graph(graph: onnx.GraphProto, path: Path) -> Path:
    """``graph`` as a checked model file at opset ``OPSET``, IR ``IR_VERSION``."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _kv_io(
    layers: int, patterns: KVPatterns, heads: int, head_size: int
) -> tuple[list, list, list]:
    """Past inputs, present outputs and Identity nodes (present = past) for ``layers`` layers."""
    past_k, past_v, present_k, present_v = patterns
    inputs, outputs, nodes = [], [], []
    shape: Dims = ["batch", heads, "past_seq", head_size]
    for i in range(layers):
        for src, dst in ((past_k % i, present_k % i), (past_v % i, present_v % i)):
            inputs.append(helper.make_tensor_value_info(src, FLOAT, shape))
            outputs.append(helper.make_tensor_value_info(dst, FLOAT, shape))
            nodes.append(helper.make_node("Identity", [src], [dst]))
    return inputs, outputs, nodes


def _weight(name: str, rows: int, cols: int) -> onnx.TensorProto:
    data = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) / (rows * cols)
    return numpy_helper.from_array(data, name)


def decoder(
    path: Path,
    *,
    layers: int = 1,
    kv: KVPatterns = DEFAULT_KV,
    heads: int = HEADS,
    head_size: int = HEAD_SIZE,
    vocab: int = VOCAB,
    mask_name: str = "attention_mask",
) -> Path:
    """A one-graph decoder: input_ids, attention mask, past KV -> logits, present KV."""
    ids = helper.make_tensor_value_info("input_ids", INT64, ["batch", "seq"])
    mask = helper.make_tensor_value_info(mask_name, INT64, ["batch", "total_seq"])
    logits = helper.make_tensor_value_info("logits", FLOAT, ["batch", "seq", vocab])
    kv_in, kv_out, kv_nodes = _kv_io(layers, kv, heads, head_size)
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["logits"]), *kv_nodes]
    graph = helper.make_graph(
        nodes,
        "tiny_decoder",
        [ids, mask, *kv_in],
        [logits, *kv_out],
        initializer=[_weight("table", vocab, vocab)],
    )
    return save_graph(graph, path)


def pruned_decoder(path: Path, table: np.ndarray) -> Path:
    """A cache-free decoder exported like the builder's ``prune_lm_head=true``: logits
    ``[batch, 1, vocab]`` = ``table[input_ids[:, -1]]`` whatever the number of tokens."""
    vocab = table.shape[1]
    ids = helper.make_tensor_value_info("input_ids", INT64, ["batch", "seq"])
    mask = helper.make_tensor_value_info("attention_mask", INT64, ["batch", "total_seq"])
    logits = helper.make_tensor_value_info("logits", FLOAT, ["batch", 1, vocab])
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["all_logits"]),
        helper.make_node("Gather", ["all_logits", "last"], ["picked"], axis=1),
        helper.make_node("Unsqueeze", ["picked", "axis1"], ["logits"]),
    ]
    initializers = [
        numpy_helper.from_array(table.astype(np.float32), "table"),
        numpy_helper.from_array(np.array(-1, np.int64), "last"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
    ]
    graph = helper.make_graph(
        nodes, "tiny_pruned_decoder", [ids, mask], [logits], initializer=initializers
    )
    return save_graph(graph, path)


def embeddings(
    path: Path, *, output: str = "inputs_embeds", dtype: int = FLOAT, vocab: int = VOCAB
) -> Path:
    """input_ids -> ``output`` [batch, seq, hidden] (cast to ``dtype``)."""
    ids = helper.make_tensor_value_info("input_ids", INT64, ["batch", "seq"])
    out = helper.make_tensor_value_info(output, dtype, ["batch", "seq", HIDDEN])
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["gathered"]),
        helper.make_node("Cast", ["gathered"], [output], to=dtype),
    ]
    graph = helper.make_graph(
        nodes, "tiny_embeddings", [ids], [out], initializer=[_weight("table", vocab, HIDDEN)]
    )
    return save_graph(graph, path)


def transformer(
    path: Path,
    *,
    input: str = "inputs_embeds",
    output: str = "hidden_states",
    layers: int = 1,
) -> Path:
    """``input`` [batch, seq, hidden] + attention_mask + past KV -> ``output`` + present KV."""
    embeds = helper.make_tensor_value_info(input, FLOAT, ["batch", "seq", HIDDEN])
    mask = helper.make_tensor_value_info("attention_mask", INT64, ["batch", "total_seq"])
    hidden = helper.make_tensor_value_info(output, FLOAT, ["batch", "seq", HIDDEN])
    kv_in, kv_out, kv_nodes = _kv_io(layers, DEFAULT_KV, HEADS, HEAD_SIZE)
    nodes = [helper.make_node("Identity", [input], [output]), *kv_nodes]
    graph = helper.make_graph(nodes, "tiny_transformer", [embeds, mask, *kv_in], [hidden, *kv_out])
    return save_graph(graph, path)


def lm_head(path: Path, *, input: str = "hidden_states", vocab: int = VOCAB) -> Path:
    """``input`` [batch, seq, hidden] -> logits [batch, seq, vocab]."""
    hidden = helper.make_tensor_value_info(input, FLOAT, ["batch", "seq", HIDDEN])
    logits = helper.make_tensor_value_info("logits", FLOAT, ["batch", "seq", vocab])
    nodes = [helper.make_node("MatMul", [input, "weight"], ["logits"])]
    graph = helper.make_graph(
        nodes, "tiny_lm_head", [hidden], [logits], initializer=[_weight("weight", HIDDEN, vocab)]
    )
    return save_graph(graph, path)


def pipeline_folder(folder: Path, *, embeds_dtype: int = FLOAT) -> Path:
    """embeds.onnx, transformer.onnx and lm_head.onnx, as the decoder-pipeline preset names them."""
    embeddings(folder / "embeds.onnx", dtype=embeds_dtype)
    transformer(folder / "transformer.onnx")
    lm_head(folder / "lm_head.onnx")
    return folder


def write_config(folder: Path, doc: dict[str, Any]) -> Path:
    """Write ``doc`` as ``folder/genai_config.json`` and return the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "genai_config.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return folder
