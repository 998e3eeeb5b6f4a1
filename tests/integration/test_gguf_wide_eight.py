"""``--quant int4-wide``: narrow 8-bit GGUF blocks (Q5_0's 32, Q6_K's 16) re-rounded to
symmetric 8-bit blocks of 128 where that adds under a quarter of the source's own rounding
noise, checked against the GGUF's own dequantisation (the NumPy reference), through
onnxruntime's MatMulNBits, and in an imported folder against the exact default (``int4``)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper

from genai_runtime.errors import GenaiRuntimeError
from genai_runtime.importer import import_gguf
from genai_runtime.importer.footprint import footprint
from genai_runtime.importer.gguf_file import Tensor
from genai_runtime.importer.quantise import WIDE_EIGHT, WIDE_EIGHT_LIMIT, wide_eight_bit
from genai_runtime.importer.weights import to_blocks

gguf_models = pytest.importorskip("gguf_models", reason="needs the gguf extra")

Q = gguf_models.Q
PROMPT = [5, 80, 259, 260, 261, 44, 1, 70, 90]


def gguf_blocks(qtype, rows: int = 40, cols: int = 512, seed: int = 7):
    raw = gguf_models.random_blocks(np.random.default_rng(seed), qtype, rows, cols)
    return to_blocks(Tensor("w", (cols, rows), qtype, raw))


def test_q5_0_becomes_8bit_blocks_of_128_within_a_quarter_of_its_own_noise():
    exact = gguf_blocks(Q.Q5_0)
    assert (exact.bits, exact.block) == (8, 32)
    wide, how = wide_eight_bit(exact)
    assert (wide.bits, wide.block) == (8, WIDE_EIGHT) and wide.symmetric
    assert "blocks of 128" in how
    ref = exact.dequantize()
    err = wide.dequantize() - ref
    own = np.mean(exact.scales.astype(np.float64) ** 2) / 12  # Q5_0's step^2 / 12
    assert np.mean(err.astype(np.float64) ** 2) <= WIDE_EIGHT_LIMIT * own
    # A value lands within half a step of the wide grid, or a step at the clipped positive end
    # (the block's peak of largest magnitude sets the scale at code -128).
    steps = np.repeat(np.abs(wide.scales), WIDE_EIGHT, axis=1)
    assert (np.abs(err) <= 1.0001 * steps).all()
    assert np.mean(np.abs(err) <= 0.5001 * steps) > 0.99


def test_q8_0_and_narrow_rows_stay_exact():
    q8 = gguf_blocks(Q.Q8_0)
    same, how = wide_eight_bit(q8)  # its own 8-bit step: re-rounding would add more than allowed
    assert how == "exact" and same is q8
    short = gguf_blocks(Q.Q5_0, cols=96)  # K not a multiple of 128
    assert wide_eight_bit(short) == (short, "exact")
    q4 = gguf_blocks(Q.Q4_0)
    assert wide_eight_bit(q4) == (q4, "exact")


def test_onnxruntime_matmulnbits_computes_the_wide_blocks():
    wide, _ = wide_eight_bit(gguf_blocks(Q.Q5_0, rows=10, cols=256))
    x = np.random.default_rng(2).standard_normal((3, 256)).astype(np.float32)
    got = gguf_models.matmul_nbits_run(wide, x)
    np.testing.assert_allclose(got, x @ wide.dequantize().T, rtol=1e-4, atol=1e-5)


def run_logits(folder, ids: list[int]) -> np.ndarray:
    import genai_runtime as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 1)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    return np.asarray(gen.get_logits())[0, -1]


def test_wide_import_widens_q5_0_where_the_default_keeps_it_exact(tmp_path):
    path = gguf_models.write_tiny_gguf(
        tmp_path / "q5_0.gguf", qtype=Q.Q5_0, dims={"hidden": 128, "ffn": 256}
    )
    wide = import_gguf(path, tmp_path / "wide", quant="int4-wide").out_dir  # at level 4
    exact = import_gguf(path, tmp_path / "exact").out_dir  # the defaults: int4, level 4
    kinds = json.loads((wide / "import.json").read_text())["weights"]
    tied = {"int8 from Q8_0 (exact)": 1, "the embedding's blocks": 1}  # the Q8_0 table, the head
    assert kinds == {"int8 from Q5_0 (8-bit blocks of 128, re-rounded)": 14, **tied}
    exact_kinds = json.loads((exact / "import.json").read_text())["weights"]
    assert exact_kinds == {"int8 from Q5_0 (exact)": 14, **tied}
    blocks = {
        helper.get_attribute_value(a)
        for n in onnx.load(str(wide / "model.onnx"), load_external_data=False).graph.node
        if n.op_type == "MatMulNBits"
        for a in n.attribute
        if a.name == "block_size"
    }
    assert blocks == {WIDE_EIGHT, 32}  # the projections; the tied head reads the Q8_0 table
    assert (
        footprint(wide / "model.onnx").matrix_bytes < footprint(exact / "model.onnx").matrix_bytes
    )
    # At accuracy level 4 onnxruntime rounds each matrix's activations to int8 per block, so
    # per 128 values here: both folders land near the GGUF's NumPy forward, not on it (random
    # tiny weights put the logits far wider apart than a trained model's).
    ref = gguf_models.numpy_logits(path, PROMPT)[-1]
    for folder in (wide, exact):
        err = np.abs(run_logits(folder, PROMPT) - ref).max()
        assert 1e-6 < err <= 0.06 * np.abs(ref).max(), (folder.name, err)


def q4_k_blocks(rows: int = 24, cols: int = 512, seed: int = 3):
    raw = gguf_models.random_q4_k(np.random.default_rng(seed), rows, cols, 0.15)
    return to_blocks(Tensor("w", (cols, rows), Q.Q4_K, raw))


def test_q4_k_widened_to_8bit_blocks_of_128_moves_by_a_sliver_of_its_own_noise():
    exact = q4_k_blocks()
    assert (exact.bits, exact.block) == (4, 32) and exact.offsets is not None
    wide, _ = wide_eight_bit(exact.widened())
    assert (wide.bits, wide.block) == (8, WIDE_EIGHT) and wide.symmetric and wide.offsets is None
    err = wide.dequantize() - exact.dequantize()
    own = np.mean(exact.scales.astype(np.float64) ** 2) / 12  # Q4_K's step^2 / 12
    assert np.mean(err.astype(np.float64) ** 2) <= 0.05 * own
    assert wide_eight_bit(exact) == (exact, "exact")  # 4-bit blocks are int4-wide's to keep


def test_int8_wide_import_has_only_8bit_blocks_of_128_and_no_offset_matmul(tmp_path):
    path = gguf_models.write_tiny_gguf(
        tmp_path / "q4_k.gguf", qtype=Q.Q4_K, dims={"hidden": 256, "ffn": 512}
    )
    out = import_gguf(path, tmp_path / "wide", quant="int8-wide").out_dir
    kinds = json.loads((out / "import.json").read_text())["weights"]
    assert kinds["int8 from Q4_K (8-bit blocks of 128, re-rounded)"] == 14
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    forms = {
        (attrs["bits"], attrs["block_size"])
        for n in graph.node
        if n.op_type == "MatMulNBits"
        for attrs in [{a.name: helper.get_attribute_value(a) for a in n.attribute}]
    }
    assert (8, WIDE_EIGHT) in forms and not [f for f in forms if f[0] == 4]
    assert not [i.name for i in graph.initializer if i.name.endswith(".offsets_t")]
    # (No logits bound here: int8 activations put the random Q4_K model's logits far from its
    # NumPy forward in every level-4 form, the exact int4 included; the weights are checked
    # above, onnxruntime's reading of 8-bit blocks of 128 in the Q5_0 tests.)
    with pytest.raises(GenaiRuntimeError, match="--quant int8-wide needs --accuracy-level 4"):
        import_gguf(path, tmp_path / "slow", quant="int8-wide", accuracy_level=0)
