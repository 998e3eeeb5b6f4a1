"""``--quant int4-lean``: GGUF blocks re-rounded to MatMulNBits' leaner forms (4-bit codes with
integer zero points instead of a float offset; 8-bit blocks of 32 instead of 16), checked
against the GGUF's own dequantisation (``weights.to_blocks(...).dequantize()``, the NumPy
reference), through onnxruntime's MatMulNBits, in an imported graph, and in ``show``'s counts."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from genai_runtime.cli import main
from genai_runtime.importer import import_gguf
from genai_runtime.importer.footprint import footprint, gguf_bytes_per_token
from genai_runtime.importer.gguf_file import GGUFModel, Tensor, read_gguf
from genai_runtime.importer.quantise import asym_blocks, lean_blocks
from genai_runtime.importer.weights import to_blocks

gguf_models = pytest.importorskip("gguf_models", reason="needs the gguf extra")

Q = gguf_models.Q
PROMPT = [5, 80, 259, 260, 261, 44, 1, 70, 90]


def q4_k_tensor(rows: int = 24, cols: int = 512, seed: int = 3) -> Tensor:
    raw = gguf_models.random_q4_k(np.random.default_rng(seed), rows, cols, 0.15)
    return Tensor("w", (cols, rows), Q.Q4_K, raw)


def offset_matmuls(folder) -> list[str]:
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    return [i.name for i in graph.initializer if i.name.endswith(".offsets_t")]


def test_lean_q4_k_dequantises_within_its_rounding_error_of_the_gguf_values():
    exact = to_blocks(q4_k_tensor())
    ref = exact.dequantize()  # the GGUF's Q4_K values: (d*sc)*q - dmin*m
    lean, how = lean_blocks(exact)
    assert lean.bits == 4 and lean.offsets is None and "zero points" in how
    assert not lean.symmetric  # the zero points are kept: they carry the offsets
    n, k = ref.shape
    err = (lean.dequantize() - ref).reshape(n, k // lean.block, lean.block)
    # A value lands on its block's grid: at most half a step away, or, past an end of the grid
    # (the least-squares grid may be a little narrower than the block's range), a bit more.
    step = lean.scales[..., None]
    assert (np.abs(err) <= 1.5 * step).all()
    assert np.mean(np.abs(err) <= 0.5001 * step) > 0.99
    # On average the re-rounding costs less than Q4_K's own rounding noise (its step^2 / 12).
    own = np.mean(exact.scales.astype(np.float64) ** 2) / 12
    assert np.mean(err.astype(np.float64) ** 2) < own


def test_lean_q6_k_head_becomes_8bit_blocks_of_32():
    raw = gguf_models.random_blocks(np.random.default_rng(4), Q.Q6_K, 6, 512)
    exact = to_blocks(Tensor("w", (512, 6), Q.Q6_K, raw))
    assert (exact.bits, exact.block) == (8, 16)
    lean, how = lean_blocks(exact, head=True)
    assert (lean.bits, lean.block) == (8, 32) and lean.symmetric and "8-bit" in how
    err = np.abs(lean.dequantize() - exact.dequantize()).reshape(6, -1, 32)
    assert (err <= 1.0001 * np.abs(lean.scales)[..., None]).all()  # a step at most (clipped end)
    assert err.max() < 0.02 * np.abs(exact.dequantize()).max()
    q8, how = lean_blocks(to_blocks(Tensor("w", (512, 6), Q.Q8_0, gguf_models.random_blocks(
        np.random.default_rng(5), Q.Q8_0, 6, 512))))  # fmt: skip
    assert how == "exact" and q8.block == 32  # already symmetric blocks of 32


@pytest.mark.parametrize("k, block", [(96, 32), (128, 64)])  # 3 blocks: an odd zero-point row
def test_onnxruntime_matmulnbits_computes_the_lean_blocks(k, block):
    rng = np.random.default_rng(k)
    w = (rng.standard_normal((10, k)) * 0.1 + 0.03).astype(np.float32)
    blocks = asym_blocks(w, 4, block)
    x = rng.standard_normal((3, k)).astype(np.float32)
    got = gguf_models.matmul_nbits_run(blocks, x)
    np.testing.assert_allclose(got, x @ blocks.dequantize().T, rtol=1e-4, atol=1e-5)
    assert np.abs(blocks.dequantize() - w).max() <= 1.0001 * blocks.scales.max()


def test_lean_import_has_no_offset_matmul_and_reads_fewer_bytes(tmp_path, capsys):
    path = gguf_models.write_tiny_gguf(
        tmp_path / "q4_k.gguf", qtype=Q.Q4_K, dims={"hidden": 256, "ffn": 512}
    )
    exact = import_gguf(path, tmp_path / "exact", quant="int4", accuracy_level=0).out_dir
    lean = import_gguf(path, tmp_path / "lean", quant="int4-lean", accuracy_level=0).out_dir
    report = json.loads((lean / "import.json").read_text())
    assert report["quant"] == "int4-lean"
    assert all("re-rounded" in how for how in report["weights"] if "Q4_K" in how)
    assert offset_matmuls(lean) == []
    assert len(offset_matmuls(exact)) == 2 * 4  # q/k/v, o, gate/up, down in each of 2 layers
    # The folder holds lean_blocks' codes, scales and zero points, packed as MatMulNBits reads
    # them (onnxruntime computing those is checked above).
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(lean / "model.onnx")).graph
             .initializer if i.name.startswith("layers.0.mlp.down_proj.")}  # fmt: skip
    want, _ = lean_blocks(to_blocks(GGUFModel(path).tensor("blk.0.ffn_down.weight")))
    b, scales, zp = want.packed()
    np.testing.assert_array_equal(inits["layers.0.mlp.down_proj.qweight"], b)
    np.testing.assert_array_equal(inits["layers.0.mlp.down_proj.scales"].reshape(-1), scales)
    np.testing.assert_array_equal(inits["layers.0.mlp.down_proj.zero_points"].reshape(-1), zp)
    # Next to the exact import's logits the lean graph is off by the re-rounding alone: about
    # as far as int8 activations (accuracy level 4) take the exact weights on this random model.
    sess = {f: ort.InferenceSession(str(f / "model.onnx")) for f in (exact, lean)}
    feeds = {"input_ids": np.asarray([PROMPT], np.int64),
             "attention_mask": np.ones((1, len(PROMPT)), np.int64)}  # fmt: skip
    for inp in sess[lean].get_inputs():
        if inp.name.startswith("past_key_values"):
            feeds[inp.name] = np.zeros((1, inp.shape[1], 0, inp.shape[3]), np.float32)
    a, b = (sess[f].run(["logits"], feeds)[0][0] for f in (exact, lean))
    assert 0 < np.sqrt(np.mean((a - b) ** 2)) <= 0.1 * np.sqrt(np.mean(a**2))
    # show: the lean folder's projections hold 4-bit codes, an fp32 scale and a 4-bit zero
    # point per block of 32 (5.125 bits) or 64 (4.5625); the exact one adds an fp32 offset per
    # block of 32 (6.125 bits). The tied head is the Q8_0 embedding, in fp32 at accuracy level
    # 0 (4 bytes a weight); a token reads one 8-bit row of the table (256 + 8 fp32 scales).
    fat, thin = footprint(exact / "model.onnx"), footprint(lean / "model.onnx")
    head = GGUFModel(path).hyper.vocab * 256
    proj = fat.weights - head
    assert fat.weights == thin.weights and fat.lookup_bytes == thin.lookup_bytes == 256 + 32
    assert fat.matrix_bytes == head * 4 + proj * 6.125 / 8
    assert proj * 4.5625 / 8 <= thin.matrix_bytes - head * 4 <= proj * 5.125 / 8
    assert main(["show", str(lean), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["bits_per_weight"] == round(thin.bits_per_weight, 3) < fat.bits_per_weight
    assert info["weight_bytes_per_token_mib"] == round(thin.bytes_per_token / 2**20, 1)
    # bench sets it beside the GGUF it came from: every matrix of the file once, the tied
    # embedding whole (it is the head); the file's vectors (norms) not counted
    _, tensors = read_gguf(path)
    matrices = sum(t.data.nbytes for t in tensors.values() if len(t.shape) >= 2)
    assert "output.weight" not in tensors and gguf_bytes_per_token(path) == matrices
    assert matrices < sum(t.data.nbytes for t in tensors.values())


def test_lean_q4_k_embedding_is_gathered_from_the_packed_lean_bytes(tmp_path):
    """A tied Q4_K table: GatherBlockQuantized reads the lean codes, scales and zero points that
    the head's MatMulNBits reads; the looked-up rows are the lean blocks' rows."""
    path = gguf_models.write_tiny_gguf(tmp_path / "e.gguf", qtype=Q.Q4_K, head_qtype=Q.Q4_K,
                                       dims={"hidden": 256, "ffn": 512})  # fmt: skip
    out = import_gguf(path, tmp_path / "lean", quant="int4-lean", accuracy_level=0).out_dir
    graph = onnx.load(str(out / "model.onnx")).graph
    gather = next(n for n in graph.node if n.op_type == "GatherBlockQuantized")
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    assert gather.input[2:] == ["embed_tokens.scales", "embed_tokens.zero_points"]
    # Run that node alone on the folder's own initializers.
    ids = np.asarray([[3, 0, 263, 70]], np.int64)
    want, _ = lean_blocks(to_blocks(GGUFModel(path).tensor("token_embd.weight")), head=True)
    b, _, _ = want.packed()
    node = helper.make_node("GatherBlockQuantized", ["B", "ids", "S", "Z"], ["rows"],
                            domain="com.microsoft", bits=4, block_size=want.block,
                            gather_axis=0, quantize_axis=1)  # fmt: skip
    tensors = [
        numpy_helper.from_array(b.reshape(b.shape[0], -1), "B"),
        numpy_helper.from_array(inits["embed_tokens.scales"], "S"),
        numpy_helper.from_array(inits["embed_tokens.zero_points"], "Z"),
    ]
    g = helper.make_graph([node], "gather",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
                          [helper.make_tensor_value_info("rows", TensorProto.FLOAT, None)],
                          tensors)  # fmt: skip
    model = helper.make_model(g, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])  # fmt: skip
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"ids": ids})[0][0]
    np.testing.assert_allclose(got, want.dequantize()[ids[0]], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(inits["embed_tokens.qweight"], b)
