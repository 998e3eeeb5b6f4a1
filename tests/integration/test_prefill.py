"""Prompt processing variants give the same greedy tokens as the plain run on the real SmolLM2
model: a prefill/decode two-file split sharing one KV cache, and chunked prefill
(``search.chunk_size``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import speculative_models as sm

import genai_runtime as og

PROMPT = (
    "The history of the printing press begins in the fifteenth century, when movable type made "
    "books cheaper and faster to produce than ever before. Scholars, merchants and clergy all "
    "wanted copies, and within a few decades presses had spread across Europe. Newspapers, "
    "pamphlets and maps followed, literacy rose, and ideas travelled further than any single "
    "voice could carry them. Explain briefly"
)


def _greedy(model: og.Model, ids, **options) -> list[int]:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 12, **options)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    return generator.get_sequence(0).tolist()


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path) -> og.Model:
    return og.Model(smollm2_dir)


@pytest.fixture(scope="module")
def prompt_ids(smollm2: og.Model):
    ids = og.Tokenizer(smollm2).encode(PROMPT)
    assert len(ids) > 64  # every chunk size splits the prompt
    return ids


@pytest.fixture(scope="module")
def unchunked(smollm2: og.Model, prompt_ids) -> list[int]:
    return _greedy(smollm2, prompt_ids)


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_prefill_gives_the_unchunked_tokens(
    smollm2: og.Model, prompt_ids, unchunked: list[int], chunk: int
) -> None:
    assert _greedy(smollm2, prompt_ids, chunk_size=chunk) == unchunked


def split_model(src: Path, dst: Path) -> Path:
    """A prefill/decode pair from one decoder: ``prefill.onnx`` is the graph as is,
    ``decode.onnx`` the same weights with ``input_ids`` fixed to one token per row. Both point
    at one copy of the external weights; the config runs each on its own passes."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "model.onnx.data", dst / "model.onnx.data")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(src / name, dst / name)
    graph = onnx.load(str(src / "model.onnx"), load_external_data=False)
    onnx.save(graph, str(dst / "prefill.onnx"))
    ids = next(i for i in graph.graph.input if i.name == "input_ids")
    ids.type.tensor_type.shape.dim[1].ClearField("dim_param")
    ids.type.tensor_type.shape.dim[1].dim_value = 1
    onnx.save(graph, str(dst / "decode.onnx"))
    v1 = json.loads((src / "genai_config.json").read_text())["model"]
    doc = {
        "version": 2,
        "pipeline": {
            "extends": "prefill-decode",
            "sessions": {"prefill": {"file": "prefill.onnx"}, "decode": {"file": "decode.onnx"}},
            "state": {"kv_cache": {"head_size": v1["decoder"]["head_size"]}},
        },
        "tokens": {"bos": v1["bos_token_id"], "eos": [v1["eos_token_id"]],
                   "pad": v1["pad_token_id"]},
        "generation": {"max_length": 256, "past_present_share_buffer": True},
    }  # fmt: skip
    (dst / "genai_config.json").write_text(json.dumps(doc))
    return dst


def test_prefill_decode_split_gives_the_unsplit_tokens(
    smollm2_dir: Path, prompt_ids, unchunked: list[int], tmp_path: Path
) -> None:
    model = og.Model(split_model(smollm2_dir, tmp_path / "split"))
    assert model.route.kind == "prefill-decode"
    assert _greedy(model, prompt_ids) == unchunked
    assert _greedy(model, prompt_ids, chunk_size=7) == unchunked


def test_a_failed_chunk_leaves_the_cache_where_the_generator_is(tmp_path: Path) -> None:
    """Chunked prefill that fails in a later chunk rewinds the cache to where the prompt began
    (it used to rewind to the failed chunk's start, keeping the first chunk's rows while the
    generator counted none), so the next prompt runs on a clean cache."""
    emb, head = sm.weights(0)
    table = emb[:8]  # ids 8.. are in the vocabulary but past the embedding table: Gather fails
    sm.context_decoder(tmp_path / "model.onnx", table, head)
    model = og.Model(sm.write_config(tmp_path, sm.decoder_config()))
    params = og.GeneratorParams(model)
    params.set_search_options(chunk_size=2)
    generator = og.Generator(model, params)
    with pytest.raises(og.ModelError, match="model run failed"):
        generator.append_tokens([1, 2, 3, 12])  # the first chunk runs, the second fails
    assert generator.token_count() == 0
    assert generator.kv_cache.length == 0
    generator.append_tokens([1, 2, 3, 4])
    expected = sm.reference_logits(np.array([1, 2, 3, 4]), table, head)[-1]
    np.testing.assert_allclose(generator.get_logits()[0, 0], expected, rtol=1e-5, atol=1e-5)
