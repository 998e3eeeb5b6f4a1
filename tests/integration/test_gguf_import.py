"""GGUF import on tiny GGUF files written here: graph vs a NumPy forward pass, MatMulNBits
blocks, tokenizer and configs, cache layouts, and every bad input leaving nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from genai_runtime.errors import GenaiRuntimeError, ModelError, UnsupportedError
from genai_runtime.importer import import_gguf
from genai_runtime.importer.gguf_file import GGUFModel, Tensor
from genai_runtime.importer.weights import dequantize, to_blocks

gguf_models = pytest.importorskip("gguf_models", reason="needs the gguf extra")

Q = gguf_models.Q
PROMPT = [5, 80, 259, 260, 261, 44, 1, 70, 90]


def run_graph(folder: Path, ids: list[int]) -> np.ndarray:
    """Logits [S, vocab] from one onnxruntime call with an empty KV cache."""
    sess = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {
        "input_ids": np.asarray([ids], np.int64),
        "attention_mask": np.ones((1, len(ids)), np.int64),
    }
    for inp in sess.get_inputs():
        if inp.name.startswith("past_key_values"):
            feeds[inp.name] = np.zeros((1, inp.shape[1], 0, inp.shape[3]), np.float32)
    return sess.run(["logits"], feeds)[0][0]


def greedy(folder: Path, ids: list[int], new: int) -> list[int]:
    import genai_runtime as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    out = []
    while not gen.is_done():
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("gguf")
    files = {
        "q4_1": gguf_models.write_tiny_gguf(base / "q4_1.gguf", qtype=Q.Q4_1),
        "q4_0": gguf_models.write_tiny_gguf(base / "q4_0.gguf", qtype=Q.Q4_0, tied=False),
        "q8_0": gguf_models.write_tiny_gguf(base / "q8_0.gguf", qtype=Q.Q8_0),
        # K-quants come in 256-value super-blocks: every in-feature count a multiple of 256.
        "q4_k": gguf_models.write_tiny_gguf(
            base / "q4_k.gguf", qtype=Q.Q4_K, dims={"hidden": 256, "ffn": 512}
        ),
    }
    return files


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q4_K])
def test_matmulnbits_blocks_reproduce_gguf_dequantisation(tmp_path, qtype):
    dims = {"hidden": 256, "ffn": 512} if qtype == Q.Q4_K else None
    path = gguf_models.write_tiny_gguf(tmp_path / "m.gguf", qtype=qtype, dims=dims)
    model = GGUFModel(path)
    t = model.tensor("blk.0.ffn_gate.weight")
    blocks = to_blocks(t)
    assert blocks is not None and blocks.bits == 4
    ref = dequantize(t)
    # Q4_0 is bit-exact; Q4_1 (d*q + m) and Q4_K ((d*sc)*q - dmin*m) are the same two fp32
    # terms, each exact, added in the same order.
    np.testing.assert_array_equal(blocks.dequantize(), ref)
    assert np.abs(ref).max() > 0.01  # real weights, not zero blocks
    embed = model.tensor("token_embd.weight")  # Q8_0: 8-bit codes, zero point 128, exact
    assert to_blocks(embed).bits == 8
    np.testing.assert_array_equal(to_blocks(embed).dequantize(), dequantize(embed))


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q5_0, Q.Q5_1, Q.Q5_K, Q.Q6_K])
def test_wider_gguf_blocks_become_exact_8bit_blocks(qtype):
    rows, cols = 6, 512
    raw = gguf_models.random_blocks(np.random.default_rng(1), qtype, rows, cols)
    t = Tensor("w", (cols, rows), qtype, raw)
    blocks = to_blocks(t)
    assert blocks.bits == 8 and blocks.block == (16 if qtype == Q.Q6_K else 32)
    ref = dequantize(t)
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0.01
    np.testing.assert_array_equal(blocks.dequantize(), ref)


@pytest.mark.parametrize("name", ["q4_1", "q4_0", "q8_0", "q4_k"])
@pytest.mark.parametrize("quant", ["fp32", "int4"])
def test_graph_logits_match_numpy_forward(tiny, tmp_path, name, quant):
    out = tmp_path / "model"
    result = import_gguf(tiny[name], out, quant=quant, accuracy_level=0)
    ref = gguf_models.numpy_logits(tiny[name], PROMPT)
    got = run_graph(out, PROMPT)
    assert got.shape == ref.shape
    # q4_k's hidden size is 256, not 64: its logits run ~4x larger, and so does fp32 rounding;
    # 1e-3 is the issue's bar for the real model.
    tol = 1e-3 if name == "q4_k" else 1e-4
    assert np.abs(got - ref).max() <= tol, np.abs(got - ref).max()
    # int8 activations at run time: close, not exact (checked on the legacy types; the random
    # Q4_K model's uniform codes over 256 inputs put it far from any real weight distribution).
    if result.nbits and name != "q4_k":
        fast = run_graph(
            import_gguf(tiny[name], tmp_path / "fast", accuracy_level=4).out_dir, PROMPT
        )
        assert 1e-6 < np.abs(fast - ref).max() <= 0.05 * np.abs(ref).max()
    if quant == "int4" and name != "q8_0":
        # 7 projections x 2 layers (+ the untied Q4_0 head), and the Q8_0 embedding table as
        # 8-bit blocks (GatherBlockQuantized, exact).
        assert len(result.nbits) == 1 + 7 * 2 + (1 if name == "q4_0" else 0)
        assert not [n for n in result.dequantised if n.startswith("blk.")]
    elif quant == "int4":  # Q8_0 projections: 8-bit blocks need accuracy level 4, so fp32 here
        assert result.nbits == ("token_embd.weight",)
    else:
        assert result.nbits == ()


def test_cache_layouts_and_dtypes_generate_the_numpy_greedy_tokens(tiny, tmp_path):
    ids, new = PROMPT[:4], 12
    seq = list(ids)
    for _ in range(new):
        seq.append(int(np.argmax(gguf_models.numpy_logits(tiny["q4_1"], seq)[-1])))
    expected = seq[len(ids) :]
    runs = {}
    for quant in ("fp32", "int4"):
        for cache in ("share-buffer", "concat", "static-scatter"):
            out = tmp_path / f"{quant}-{cache}"
            import_gguf(tiny["q4_1"], out, quant=quant, cache=cache, accuracy_level=0)
            share = json.loads((out / "genai_config.json").read_text())["search"]
            assert share["past_present_share_buffer"] is (cache == "share-buffer")
            runs[(quant, cache)] = greedy(out, ids, new)
            # The v2 form written beside it is the same model.
            runs[(quant, cache, "v2")] = greedy(out / "genai_config.v2.json", ids, new)
    for key, tokens in runs.items():
        assert tokens == expected, key


def test_static_scatter_import_layout_and_batches(tiny, tmp_path):
    import genai_runtime as og

    out = tmp_path / "static"
    import_gguf(tiny["q4_1"], out, cache="static-scatter", max_seq_len=48, accuracy_level=0)
    cfg = json.loads((out / "genai_config.json").read_text())
    assert cfg["search"]["max_length"] == 48
    model = og.Model(str(out))
    params = og.GeneratorParams(model)
    params.set_search_options(batch_size=2, max_length=40)
    generator = og.Generator(model, params)
    assert generator.kv_plan.kind == "static-scatter"
    assert generator.kv_plan.layout.static_capacity == 48
    prompts = [PROMPT[:6], PROMPT[:3]]
    pad = cfg["model"]["pad_token_id"]
    generator.append_tokens(np.array([p + [pad] * (6 - len(p)) for p in prompts], np.int64))
    for _ in range(8):
        generator.generate_next_token()
    for row, prompt in enumerate(prompts):
        # Each row of the batch equals that prompt run alone (right padding is not attended).
        alone = greedy(out, prompt, 8)
        assert generator.get_sequence(row).tolist()[6:] == alone


def test_static_scatter_import_bad_lengths(tiny, tmp_path):
    with pytest.raises(GenaiRuntimeError, match="only with --cache static-scatter"):
        import_gguf(tiny["q4_1"], tmp_path / "a", max_seq_len=64)
    with pytest.raises(GenaiRuntimeError, match="exceeds the model's context length 128"):
        import_gguf(tiny["q4_1"], tmp_path / "b", cache="static-scatter", max_seq_len=4096)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_tokenizer_and_configs_from_gguf_metadata(tiny, tmp_path):
    import genai_runtime as og

    out = tmp_path / "model"
    import_gguf(tiny["q4_1"], out, quant="fp32")
    cfg = json.loads((out / "genai_config.json").read_text())
    assert cfg["model"]["decoder"]["num_key_value_heads"] == 2
    assert cfg["model"]["eos_token_id"] == 2 and cfg["model"]["bos_token_id"] == 1
    model = og.Model(str(out))
    tok = og.Tokenizer(model)
    ids = tok.encode(" the thin ant<|im_end|>")
    assert list(ids)[:2] == [261, 259]  # "Ġthe", then "Ġt" (the merges from the GGUF)
    assert list(ids)[-1] == 2  # a control token is one special added token
    assert tok.decode(ids) == " the thin ant"  # special tokens are skipped, as the reference does
    messages = json.dumps([{"role": "user", "content": "hi"}])
    text = tok.apply_chat_template(messages, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_add_bos_from_gguf_metadata(tmp_path):
    import tokenizers

    path = gguf_models.write_tiny_gguf(tmp_path / "bos.gguf", add_bos=True)
    out = import_gguf(path, tmp_path / "model", quant="fp32").out_dir
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.encode(" the").ids == [1, 261]  # <|im_start|> is this GGUF's BOS
    assert tok.encode(" the", " the").ids == [1, 261, 1, 261]
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert cfg["add_bos_token"] is True and cfg["bos_token"] == "<|im_start|>"


def test_import_is_atomic_and_refuses_to_overwrite(tiny, tmp_path):
    out = tmp_path / "model"
    import_gguf(tiny["q4_1"], out, quant="fp32")
    with pytest.raises(GenaiRuntimeError, match="already exists; pass --force"):
        import_gguf(tiny["q4_1"], out)
    import_gguf(tiny["q4_0"], out, force=True)
    report = json.loads((out / "import.json").read_text())
    assert report["source"].endswith("q4_0.gguf") and report["quant"] == "int4"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temp folder left


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_truncated_gguf_is_a_model_error(tiny, tmp_path):
    data = tiny["q4_1"].read_bytes()
    for cut in (10, len(data) // 3, len(data) - 100):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(ModelError, match=r"cut\d+\.gguf: not a readable GGUF file"):
            import_gguf(bad, tmp_path / "out" / "model")
        assert _leftovers(tmp_path / "out") == []


def test_unsupported_architecture_and_quantisation(tmp_path):
    bad_arch = gguf_models.write_tiny_gguf(tmp_path / "arch.gguf", arch="mamba")
    with pytest.raises(UnsupportedError, match="architecture 'mamba' is not supported; supported"):
        import_gguf(bad_arch, tmp_path / "out" / "a")
    bad_q = gguf_models.write_tiny_gguf(tmp_path / "tq.gguf", qtype=Q.IQ4_NL, head_qtype=Q.Q8_0)
    with pytest.raises(UnsupportedError, match=r"quantisation type IQ4_NL, which is not supported"):
        import_gguf(bad_q, tmp_path / "out" / "q")
    assert _leftovers(tmp_path / "out") == []


def test_missing_tensor_is_named(tmp_path):
    path = gguf_models.write_tiny_gguf(tmp_path / "m.gguf")
    # Rename a tensor in the file's header: same length, so the file stays well-formed.
    path.write_bytes(path.read_bytes().replace(b"blk.1.ffn_up.weight", b"blk.1.ffn_uq.weight"))
    with pytest.raises(ModelError, match=r"tensor 'blk\.1\.ffn_up\.weight' is missing"):
        import_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cli_import_with_progress_bars(tiny, tmp_path, capsys):
    from genai_runtime.cli import main

    out = tmp_path / "model"
    assert main(["import", str(tiny["q4_1"]), str(out), "--cache", "concat"]) == 0
    err = capsys.readouterr().err
    assert "import: 15 tensors" in err  # 7 projections x 2 layers + the embedding
    assert "import: writing the ONNX files" in err  # a line per stage to a non-terminal
    assert f"-> {out} in" in err
    assert main(["import", str(tiny["q4_1"]), str(out)]) == 1
    assert "already exists; pass --force" in capsys.readouterr().err
    assert main(["import", str(tmp_path / "nope.gguf"), str(tmp_path / "x")]) == 1
    assert "GGUF file not found" in capsys.readouterr().err


def test_recommended_sampling_in_the_file_is_recorded_for_the_command_line(tmp_path):
    """llama.cpp's general.sampling.* keys become the folder's generation_config.json, which
    run and chat sample with; a file without them gets no record (their own defaults apply)."""
    from gguf_models import write_tiny_gguf

    from genai_runtime import Model
    from genai_runtime.generation_defaults import SAMPLING_FILE, defaults_for

    keys = {"temp": 0.6, "top_k": 30, "top_p": 0.85, "penalty_repeat": 1.05}
    path = write_tiny_gguf(tmp_path / "s.gguf", sampling=keys)
    out = import_gguf(path, tmp_path / "s", quant="fp32").out_dir
    recorded = json.loads((out / SAMPLING_FILE).read_text())
    want = {"temperature": 0.6, "top_k": 30, "top_p": 0.85, "repetition_penalty": 1.05}
    assert recorded == pytest.approx({**want, "do_sample": True})
    assert defaults_for(Model(str(out)).spec).sampling == recorded
    bare = import_gguf(write_tiny_gguf(tmp_path / "b.gguf"), tmp_path / "b", quant="fp32")
    assert not (bare.out_dir / SAMPLING_FILE).exists()
