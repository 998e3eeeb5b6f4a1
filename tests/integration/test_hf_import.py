"""Hugging Face folder import (config.json + safetensors, no torch) and the GGUF import of the
same weights, for llama, mistral, qwen2, qwen3, phi3 and gemma3: tiny random checkpoints written
here against a NumPy forward pass of each architecture; both sources write the same graph."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from genai_runtime.importer import import_model

H = pytest.importorskip("hf_models", reason="needs the gguf extra (gguf, safetensors)")
G = pytest.importorskip("gguf_gemma3", reason="needs the gguf extra")

LLAMA_FAMILY = ["llama", "mistral", "qwen2", "qwen3", "phi3"]
IDS = [259, 40, 300, 7, 77, 280, 12, 90, 301, 5, 66, 270]  # 12 tokens: past mistral's window


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


def stepwise_logits(folder: Path, ids: list[int], first: int = 3) -> np.ndarray:
    """Last-position logits after ids[:first], then after each further token (KV cache used)."""
    import genai_runtime as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 4)
    gen = og.Generator(model, params)
    gen.append_tokens(ids[:first])
    rows = [np.asarray(gen.get_logits()).reshape(-1).copy()]
    for tok in ids[first:]:
        gen.append_tokens([tok])
        rows.append(np.asarray(gen.get_logits()).reshape(-1).copy())
    return np.stack(rows)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, dict[str, Path]]:
    """Per architecture: the HF folder, its GGUF, and fp32 imports of each."""
    base = tmp_path_factory.mktemp("hf")
    out = {}
    for arch in [*LLAMA_FAMILY, "gemma3"]:
        folder = H.write_hf(base / arch / "hf", arch, seed=len(arch))
        gguf = H.write_gguf_from_hf(folder, base / arch / "model.gguf")
        out[arch] = {
            "hf": folder,
            "gguf": gguf,
            "hf-fp32": import_model(folder, base / arch / "hf-fp32", quant="fp32").out_dir,
            "gguf-fp32": import_model(gguf, base / arch / "gguf-fp32", quant="fp32").out_dir,
        }
    return out


@pytest.mark.parametrize("arch", LLAMA_FAMILY)
def test_hf_and_gguf_imports_match_the_numpy_forward(built, arch):
    b = built[arch]
    ref = H.numpy_logits(b["hf"], IDS)
    for key in ("hf-fp32", "gguf-fp32"):
        got = run_graph(b[key], IDS)
        assert np.abs(got - ref).max() <= 1e-4, (key, np.abs(got - ref).max())
    # Decode through the cache (and the window) gives the same last-position logits.
    if arch != "phi3":  # longrope: a full recompute past 16 tokens re-rotates old keys
        rows = np.stack([H.numpy_logits(b["hf"], IDS[: n + 1])[-1] for n in range(2, len(IDS))])
        got = stepwise_logits(b["hf-fp32"], IDS)
        assert np.abs(got - rows).max() <= 1e-4


def test_structure_is_exercised(built):
    """The checks above can fail: each architecture's feature changes the logits."""
    mistral = built["mistral"]["hf"]
    cfg = json.loads((mistral / "config.json").read_text())
    ref = H.numpy_logits(mistral, IDS)
    wider = dict(cfg, sliding_window=None)
    (mistral / "config.json").write_text(json.dumps(wider))
    try:
        assert np.abs(H.numpy_logits(mistral, IDS) - ref)[6:].max() > 1e-2  # window bites
    finally:
        (mistral / "config.json").write_text(json.dumps(cfg))
    # Phi-3's long factors: 20 tokens (> original 16) use them, and the graph's If follows.
    phi = built["phi3"]
    long_ids = IDS + IDS[:8]
    ref = H.numpy_logits(phi["hf"], long_ids)
    for key in ("hf-fp32", "gguf-fp32"):
        assert np.abs(run_graph(phi[key], long_ids) - ref).max() <= 1e-4, key
    short_ref = H.numpy_logits(phi["hf"], long_ids[:16])
    assert np.abs(ref[:16] - short_ref).max() > 1e-2


@pytest.mark.parametrize("arch", [*LLAMA_FAMILY, "gemma3"])
def test_hf_and_gguf_sources_write_the_same_graph(built, arch):
    b = built[arch]
    a, c = b["hf-fp32"], b["gguf-fp32"]
    assert (a / "model.onnx.data").read_bytes() == (c / "model.onnx.data").read_bytes()
    import onnx

    ga = onnx.load(str(a / "model.onnx"), load_external_data=False).graph
    gc = onnx.load(str(c / "model.onnx"), load_external_data=False).graph
    assert [(n.op_type, list(n.input)) for n in ga.node] == [
        (n.op_type, list(n.input)) for n in gc.node
    ]
    ca = json.loads((a / "genai_config.json").read_text())["model"]
    cc = json.loads((c / "genai_config.json").read_text())["model"]
    assert ca["decoder"] == cc["decoder"] and ca["eos_token_id"] == cc["eos_token_id"]


def test_gemma3_hf_folder_matches_the_numpy_gemma3_forward(built):
    b = built["gemma3"]
    ids = [5, 40, 300, 7, 77, 280, 12, 90, 301, 5, 66, 270]  # past the window of 5
    ref = G.numpy_gemma3_logits(G.GemmaWeights(b["gguf"]), ids)[2:]
    for key in ("hf-fp32", "gguf-fp32"):
        got = stepwise_logits(b[key], ids)
        assert np.abs(got - ref).max() <= 1e-3, (key, np.abs(got - ref).max())


def test_int4_import_is_the_rtn_weights_exactly_at_level_0(built, tmp_path):
    from genai_runtime.importer.quantise import rtn_blocks

    b = built["qwen2"]
    exact = import_model(b["hf"], tmp_path / "int4-0", quant="int4", accuracy_level=0).out_dir
    fast = import_model(b["gguf"], tmp_path / "int4-4").out_dir  # the default: level 4
    # The NumPy forward over the RTN-dequantised projections and tied table (one int4 table for
    # the lookup and the head, as the reference builder shares it) is what level 0 computes.
    cfg, tensors = H.load(b["hf"])
    rtn = {n: rtn_blocks(w, 4).dequantize() if w.ndim == 2 else w for n, w in tensors.items()}
    folder = tmp_path / "rtn-hf"
    folder.mkdir()
    H.safetensors_numpy.save_file(rtn, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    ref = H.numpy_logits(folder, IDS)
    got = run_graph(exact, IDS)
    assert np.abs(got - ref).max() <= 1e-4, np.abs(got - ref).max()
    # int8 activations: close to level 0, not equal.
    diff = np.abs(run_graph(fast, IDS) - got).max()
    assert 1e-5 < diff <= 0.05 * np.abs(got).max(), diff
    report = json.loads((fast / "import.json").read_text())
    assert report["quant"] == "int4" and report["accuracy_level"] == 4
    assert report["weights"]["int4 RTN from F32"] == 7 * 2 + 1  # projections + the table
    assert report["weights"]["the embedding's blocks"] == 1  # the tied head reads the table
    untied = import_model(built["llama"]["hf"], tmp_path / "llama-int4").out_dir
    weights = json.loads((untied / "import.json").read_text())["weights"]
    assert weights["fp32 from F32"] == 1  # an untied table stays float, as the reference keeps it


def test_int4_rtn_equals_onnxruntime_quantiser():
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

    from genai_runtime.importer.quantise import rtn_blocks

    rng = np.random.default_rng(3)
    k, n = 128, 48
    w = (rng.standard_normal((k, n)) * 0.1).astype(np.float32)
    w[:32, 0] = 0.0  # an all-zero block
    w[32:64, 1] = np.linspace(-1, 1, 32)
    # Exact halves: peak 1.0 makes 1/scale -8 (4 bits), so -(k + 0.5)/8 lands on k + 8.5.
    w[64:96, 2] = [1.0] + [-(k % 7 + 0.5) / 8 for k in range(31)]
    for bits, quantise in ((4, quantize_matmul_4bits), (8, quantize_matmul_8bits)):
        per = 8 // bits
        packed = np.zeros((n, k // 32, 32 // per), np.uint8)
        scales = np.zeros((n, k // 32), np.float32)
        zp = np.zeros((n, k // 32), np.uint8)
        quantise(packed, w, scales, zp, 32, n, k, True)
        ours = rtn_blocks(w.T, bits)
        np.testing.assert_array_equal(ours.scales, scales)
        np.testing.assert_array_equal(ours.packed()[0].reshape(packed.shape), packed)


def test_generation_config_and_tokenizer_files_are_carried(built):
    import genai_runtime as og

    folder = built["qwen2"]["hf-fp32"]
    cfg = json.loads((folder / "genai_config.json").read_text())
    assert cfg["search"]["do_sample"] is True and cfg["search"]["top_k"] == 20
    assert cfg["search"]["temperature"] == 0.7 and cfg["model"]["type"] == "qwen2"
    recorded = json.loads((folder / "generation_config.json").read_text())  # for run and chat
    assert recorded == {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20}
    tok = og.Tokenizer(og.Model(str(folder)))
    messages = json.dumps([{"role": "user", "content": "hi"}])
    text = tok.apply_chat_template(messages, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_qwen2_tokenizer_from_gguf_equals_the_original(built):
    from varied_strings import varied_strings

    from genai_runtime.importer.gguf_file import GGUFModel
    from genai_runtime.importer.tokenizer_json import tokenizer_json

    b = built["qwen2"]
    ref = H.tokenizers.Tokenizer.from_file(str(b["hf"] / "tokenizer.json"))
    doc = tokenizer_json(GGUFModel(b["gguf"]).vocab(), "x")
    ours = H.tokenizers.Tokenizer.from_str(json.dumps(doc))
    # NFC matters: a decomposed "é" must merge like the composed one.
    sample = [*H.CORPUS, "cafe\u0301 Cafe\u0301", "x<|im_end|>y 123456", *varied_strings(300)]
    for s in sample:
        assert ours.encode(s).ids == ref.encode(s).ids, s
        assert ours.decode(ours.encode(s).ids) == ref.decode(ref.encode(s).ids), s


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest.fixture
def hf_copy(built, tmp_path) -> Path:
    import shutil

    return Path(shutil.copytree(built["llama"]["hf"], tmp_path / "hf"))


def _edit_config(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **changes}))


def test_unsupported_architecture_names_what_it_found(hf_copy, tmp_path):
    from genai_runtime.errors import UnsupportedError

    _edit_config(hf_copy, model_type="mamba", architectures=["MambaForCausalLM"])
    with pytest.raises(UnsupportedError) as err:
        import_model(hf_copy, tmp_path / "out" / "m")
    msg = str(err.value)
    assert "model_type 'mamba' (architectures ['MambaForCausalLM']) is not supported" in msg
    assert "supported model_type values: gemma3_text, llama, mistral, phi3, qwen2, qwen3" in msg
    assert _leftovers(tmp_path / "out") == []


def test_shape_disagreeing_with_config_names_both(hf_copy, tmp_path):
    from genai_runtime.errors import ModelError

    _edit_config(hf_copy, intermediate_size=128)
    with pytest.raises(ModelError) as err:
        import_model(hf_copy, tmp_path / "out" / "m")
    assert (
        "model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has shape [96, 64], "
        "but config.json implies [128, 64]"
    ) in str(err.value)
    assert _leftovers(tmp_path / "out") == []


def test_truncated_safetensors_is_a_clear_error(hf_copy, tmp_path):
    from genai_runtime.errors import ModelError

    path = hf_copy / "model.safetensors"
    data = path.read_bytes()
    for cut in (4, 100, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(ModelError, match=r"model\.safetensors: not a readable safetensors"):
            import_model(hf_copy, tmp_path / "out" / "m")
    assert _leftovers(tmp_path / "out") == []


def test_missing_files_and_escaping_index_are_refused(hf_copy, tmp_path):
    from genai_runtime.errors import ModelError

    out = tmp_path / "out" / "m"
    (hf_copy / "tokenizer.json").rename(hf_copy / "tok.json")
    with pytest.raises(ModelError, match=r"no tokenizer\.json"):
        import_model(hf_copy, out)
    (hf_copy / "tok.json").rename(hf_copy / "tokenizer.json")
    index = {"weight_map": {"model.embed_tokens.weight": "../model.safetensors"}}
    (hf_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelError, match=r"'\.\./model\.safetensors' is not a plain file"):
        import_model(hf_copy, out)
    (hf_copy / "model.safetensors.index.json").unlink()
    (hf_copy / "model.safetensors").rename(hf_copy / "weights.bin")
    with pytest.raises(ModelError, match=r"no \*\.safetensors files"):
        import_model(hf_copy, out)
    with pytest.raises(ModelError, match=r"no config\.json"):
        import_model(tmp_path, out)
    assert _leftovers(tmp_path / "out") == []


def test_cli_imports_a_folder_and_refuses_int8_at_level_0(built, tmp_path, capsys):
    from genai_runtime.cli import main

    out = tmp_path / "model"
    assert main(["import", str(built["qwen3"]["hf"]), str(out), "-q"]) == 0
    assert f"-> {out} in" in capsys.readouterr().err
    report = json.loads((out / "import.json").read_text())
    assert report["format"] == "huggingface" and report["architecture"] == "qwen3"
    bad = ["import", str(built["qwen3"]["hf"]), str(tmp_path / "x"), "--quant", "int8"]
    assert main([*bad, "--accuracy-level", "0"]) == 1
    assert "--quant int8 needs --accuracy-level 4" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_fp16_and_int8_imports(built, tmp_path):
    b = built["qwen3"]
    ref = run_graph(b["hf-fp32"], IDS)
    fp16 = import_model(b["hf"], tmp_path / "fp16", quant="fp16").out_dir
    int8 = import_model(b["gguf"], tmp_path / "int8", quant="int8").out_dir
    size = (b["hf-fp32"] / "model.onnx.data").stat().st_size
    assert (fp16 / "model.onnx.data").stat().st_size < 0.55 * size  # half the bytes on disk
    # fp16 weights: the rounding of each weight only; int8: 8-bit blocks, int8 activations.
    assert 1e-6 < np.abs(run_graph(fp16, IDS) - ref).max() <= 2e-2 * np.abs(ref).max()
    assert 1e-6 < np.abs(run_graph(int8, IDS) - ref).max() <= 5e-2 * np.abs(ref).max()
    weights = json.loads((int8 / "import.json").read_text())["weights"]
    assert weights == {"int8 RTN from F32": 7 * 2 + 1, "fp32 from F32": 1}  # untied: float table
