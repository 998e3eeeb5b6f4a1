"""v1 -> v2 translation: a pure function whose output validates, builds, checks and routes.

Every v1 config under ../shared (fixtures and both real models) goes through the whole chain;
specific translated fields are checked on the configs that carry them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import require_shared

from genai_runtime.config import load
from genai_runtime.config.build import build_spec
from genai_runtime.config.flow import check_flow
from genai_runtime.config.loader import config_version, validate_document
from genai_runtime.config.presets import resolve_presets
from genai_runtime.config.v1 import merge_embedded_v1, session_name, translate_v1
from genai_runtime.routing import classify
from genai_runtime.spec import PipelineSpec, SlidingWindowSpec

GENAI = ("fixtures", "onnxruntime-genai")
EXAMPLES = (*GENAI, "examples-pipeline-config")

# Every v1 config in ../shared (path parts under it) and the route its shape implies.
V1_CONFIGS: dict[tuple[str, ...], str] = {
    (*GENAI, "dummy-decoder"): "decoder",
    (*GENAI, "tiny-random-gpt2-fp32"): "decoder",
    (*GENAI, "static-scatter-bias-decoder"): "decoder",
    (*GENAI, "pipeline-model-tiny"): "decoder-pipeline",
    (*GENAI, "speculative-tiny", "draft"): "decoder-pipeline",
    (*GENAI, "marian-batch-values"): "encoder-decoder",
    (*GENAI, "phi3-v"): "multimodal",
    (*GENAI, "multimodal-decoder-with-input-ids"): "multimodal",
    (*GENAI, "qwen2-5-vl-pipeline"): "multimodal",
    (*EXAMPLES, "05-v1-to-v2", "v1"): "decoder",
    (*EXAMPLES, "07-prefill-decode"): "prefill-decode",
    ("models", "smollm2-135m-instruct-int4"): "decoder",
    ("models", "smollm2-135m-instruct-int4-2layers"): "decoder",
    ("models", "whisper-tiny.en-int4"): "encoder-decoder",
}


def _id(parts: Sequence[str]) -> str:
    return "/".join(p for p in parts if p not in GENAI and p != "models")


def _route_param(parts: tuple[str, ...], kind: str):
    return pytest.param(parts, kind, id=_id(parts))


def read_v1(*parts: str) -> dict[str, Any]:
    """A v1 document from ../shared (its folder's genai_config.json)."""
    path = require_shared(*parts, "genai_config.json")
    return json.loads(path.read_text(encoding="utf-8-sig"))


def translated_spec(doc: dict[str, Any], model_dir: Path | None = None) -> PipelineSpec:
    """v1 doc -> translation -> schema -> presets -> schema -> spec -> flow checks."""
    validate_document(doc, 1)
    v2 = translate_v1(doc)
    validate_document(v2, 2)
    resolved, chain = resolve_presets(v2)
    validate_document(resolved, 2)
    spec = build_spec(resolved, model_dir, chain, source_version=1)
    check_flow(spec)
    return spec


def wires(spec: PipelineSpec) -> list[str]:
    return [str(w) for w in spec.dataflow]


# ------------------------------------------------------------------------------ every v1 config


def test_table_lists_every_v1_config_in_shared() -> None:
    """A new v1 fixture in ../shared must be added to V1_CONFIGS (and so be tested)."""
    shared = require_shared()
    found = set()
    for path in shared.rglob("genai_config.json"):
        doc = json.loads(path.read_text(encoding="utf-8-sig"))
        if config_version(doc) == 1:
            found.add(path.parent.relative_to(shared).parts)
    assert found == set(V1_CONFIGS)


@pytest.mark.parametrize(("parts", "kind"), [_route_param(p, k) for p, k in V1_CONFIGS.items()])
def test_translation_validates_builds_and_routes(parts: tuple[str, ...], kind: str) -> None:
    spec = translated_spec(read_v1(*parts))
    assert spec.metadata["translated_from"] == "v1"
    assert classify(spec).kind == kind


@pytest.mark.parametrize("parts", list(V1_CONFIGS), ids=_id)
def test_translation_is_pure(parts: tuple[str, ...]) -> None:
    doc = read_v1(*parts)
    before = copy.deepcopy(doc)
    out = translate_v1(doc)
    assert doc == before
    # The output shares nothing mutable with the input: editing it leaves the input alone.
    out["pipeline"]["sessions"].clear()
    out["generation"].clear()
    assert doc == before
    assert translate_v1(doc) == translate_v1(before)


@pytest.mark.parametrize("parts", list(V1_CONFIGS), ids=_id)
def test_load_of_v1_folder_equals_translation(parts: tuple[str, ...]) -> None:
    """load() on the folder goes through the same translation (paths and files aside)."""
    folder = require_shared(*parts)
    assert load(folder) == translated_spec(read_v1(*parts), folder)


# ------------------------------------------------------------------------------ shapes


def test_pipeline_model_tiny_chains_three_stages_by_wires() -> None:
    spec = translated_spec(read_v1(*GENAI, "pipeline-model-tiny"))
    assert [(s.run, s.when) for s in spec.flow] == [
        ("embeddings", "step"),
        ("transformer", "step"),
        ("language_model_head", "step"),
    ]
    assert [(w.src, w.dst) for w in spec.dataflow] == [
        ("embeddings", "transformer"),
        ("transformer", "language_model_head"),
    ]
    gather = "/model/embed_tokens/Gather/output_0"  # tensor names may hold dots and slashes
    assert wires(spec) == [
        f"embeddings.{gather} -> transformer.{gather}",
        "transformer.hidden_states -> language_model_head.hidden_states",
    ]
    assert spec.sessions["language_model_head"].file == "lm_head.onnx"
    assert any(r.startswith("stages chained by wires: embeddings.") for r in classify(spec).reasons)


def test_prefill_decode_splits_prompt_and_token_passes() -> None:
    spec = translated_spec(read_v1(*EXAMPLES, "07-prefill-decode"))
    assert spec.extends == ("prefill-decode",)
    prefill, decode = spec.flow
    assert (prefill.run, prefill.run_on_prompt, prefill.run_on_token_gen) == (
        "prefill",
        True,
        False,
    )
    assert (decode.run, decode.run_on_prompt, decode.run_on_token_gen) == ("decode", False, True)
    assert spec.dataflow == ()  # present -> past is the KV cache's job, not a wire
    assert spec.sessions["prefill"].file == "prefill.onnx"
    assert spec.generation.past_present_share_buffer is True


def test_marian_encoder_feeds_decoder_cross_attention() -> None:
    spec = translated_spec(read_v1(*GENAI, "marian-batch-values"))
    assert [(s.run, s.when, s.cross_attention_from) for s in spec.flow] == [
        ("encoder", "init", None),
        ("decoder", "step", "encoder"),
    ]
    assert wires(spec) == ["encoder.encoder_outputs -> decoder.encoder_hidden_states"]


def test_phi3v_vision_runs_per_image_and_feeds_embedding() -> None:
    spec = translated_spec(read_v1(*GENAI, "phi3-v"))
    assert [(s.run, s.when, s.loop) for s in spec.flow] == [
        ("vision", "init", "per_image"),
        ("embedding", "step", None),
        ("decoder", "step", None),
    ]
    assert wires(spec) == [
        "vision.image_features -> embedding.image_features",
        "embedding.inputs_embeds -> decoder.inputs_embeds",
    ]


def test_stage_names_with_dots_become_session_names() -> None:
    assert session_name("model.embed") == "model_embed"
    doc = read_v1(*GENAI, "pipeline-model-tiny")
    stages = doc["model"]["decoder"]["pipeline"][0]
    stages["model.embed"] = stages.pop("embeddings")
    spec = translated_spec(doc)
    assert "model_embed" in spec.sessions
    assert all("." not in name for name in spec.sessions)


# ------------------------------------------------------------------------------ fields


def test_tokens_eos_becomes_a_list_and_ids_are_kept() -> None:
    phi3v = translated_spec(read_v1(*GENAI, "phi3-v"))
    assert (phi3v.tokens.bos, phi3v.tokens.eos, phi3v.tokens.pad) == (1, (32007,), 32000)
    qwen = translate_v1(read_v1(*GENAI, "qwen2-5-vl-pipeline"))["tokens"]
    assert qwen["eos"] == [151645, 151643]
    assert (qwen["pad"], qwen["bos"]) == (151643, 151643)
    assert (qwen["image_token"], qwen["video_token"], qwen["vision_start_token"]) == (
        151655,
        151656,
        151652,
    )
    marian = translated_spec(read_v1(*GENAI, "marian-batch-values"))
    assert (marian.tokens.bos, marian.tokens.eos, marian.tokens.pad) == (32000, (0,), 32000)


@pytest.mark.parametrize("search", [{}, {"max_length": 0}, {"top_k": 1}])
def test_max_length_falls_back_to_context_length(search: dict[str, Any]) -> None:
    doc = read_v1("models", "smollm2-135m-instruct-int4-2layers")
    doc["search"] = search
    assert translate_v1(doc)["generation"]["max_length"] == 8192
    assert translated_spec(doc).generation.max_length == 8192


def test_explicit_max_length_is_kept() -> None:
    spec = translated_spec(read_v1(*GENAI, "marian-batch-values"))  # context_length 768
    assert spec.generation.max_length == 448


def test_search_options_are_kept() -> None:
    spec = translated_spec(read_v1(*GENAI, "marian-batch-values"))
    assert (spec.generation.top_k, spec.generation.do_sample) == (1, False)
    assert spec.generation.past_present_share_buffer is True


def test_session_and_run_options_are_kept() -> None:
    spec = translated_spec(read_v1(*GENAI, "tiny-random-gpt2-fp32"))
    options = spec.sessions["decoder"].options
    assert dict(options.config_entries) == {"session.use_device_allocator_for_initializers": "0"}
    assert dict(options.run_options) == {"memory.enable_memory_arena_shrinkage": ""}
    dummy = translated_spec(read_v1(*GENAI, "dummy-decoder"))
    assert dummy.sessions["decoder"].options.log_id == "onnxruntime-genai"


def test_kv_cache_patterns_and_dims() -> None:
    spec = translated_spec(read_v1("models", "smollm2-135m-instruct-int4"))
    kv = spec.state.kv_cache
    assert (kv.past_key_pattern, kv.past_value_pattern) == (
        "past_key_values.%d.key",
        "past_key_values.%d.value",
    )
    assert (kv.present_key_pattern, kv.present_value_pattern) == (
        "present.%d.key",
        "present.%d.value",
    )
    assert (kv.num_layers, kv.num_kv_heads, kv.head_size) == (30, 3, 64)
    assert kv.kind == "auto"  # the preset's: the layout is detected from the graph


def test_gpt2_past_names_translate_to_combined_format() -> None:
    kv = translated_spec(read_v1(*GENAI, "tiny-random-gpt2-fp32")).state.kv_cache
    assert kv.format == "combined"
    assert (kv.past_key_pattern, kv.present_key_pattern) == ("past_%d", "present_%d")
    assert kv.past_value_pattern is None
    assert (kv.num_layers, kv.num_kv_heads, kv.head_size) == (5, 4, 8)


def test_static_scatter_names_are_kept() -> None:
    spec = translated_spec(read_v1(*GENAI, "static-scatter-bias-decoder"))
    assert spec.state.kv_cache.past_key_pattern == "key_cache.%d"
    assert spec.state.kv_cache.present_value_pattern == "updated_value_cache.%d"
    assert spec.sessions["decoder"].inputs["write_indices"] == "write_indices"


def _with_sliding_window(window: dict[str, Any]) -> dict[str, Any]:
    doc = read_v1("models", "smollm2-135m-instruct-int4-2layers")
    doc["model"]["decoder"]["sliding_window"] = window
    return doc


def test_sliding_window_is_translated() -> None:
    window = {
        "window_size": 128,
        "pad_value": 1,
        "alignment": "left",
        "slide_key_value_cache": False,
        "slide_inputs": True,
        "cache_slack": 24,  # sizes the windowed layers' caches, as in the reference
    }
    doc = _with_sliding_window(window)
    assert translated_spec(doc).state.kv_cache.sliding_window == SlidingWindowSpec(
        window_size=128, pad_value=1, alignment="left", slide_key_value_cache=False, cache_slack=24
    )


def test_sliding_window_layers_are_kept() -> None:
    spec = translated_spec(_with_sliding_window({"window_size": 64, "layers": [0]}))
    assert spec.state.kv_cache.sliding_window.window_size == 64


def _speculative_doc(speculative: dict[str, Any], draft: bool = True) -> dict[str, Any]:
    doc = read_v1("models", "smollm2-135m-instruct-int4")
    if draft:
        doc["model"]["draft"] = copy.deepcopy(doc["model"]["decoder"])
        doc["model"]["draft"]["filename"] = "draft/model.onnx"
        doc["model"]["draft"]["num_hidden_layers"] = 2
    doc["speculative"] = speculative
    return doc


def test_v1_draft_and_speculative_block_become_a_strategy() -> None:
    doc = _speculative_doc({"max_draft_tokens": 3})
    spec = translated_spec(doc)
    s = spec.strategy
    assert (s.kind, s.producer, s.draft_session, s.verify_session) == (
        "speculative",
        "draft_model",
        "draft",
        "decoder",
    )
    assert s.num_speculative_tokens == 3
    assert spec.sessions["draft"].file == "draft/model.onnx"
    assert dict(spec.roles) == {"draft": "draft", "target": "decoder"}
    assert [step.run for step in spec.flow] == ["decoder"]  # the draft runs under the strategy
    route = classify(spec)
    assert (route.kind, route.base) == ("speculative", "decoder")
    assert "session 'draft' proposes 3 tokens, 'decoder' verifies" in route.reasons[0]


def test_v1_ngram_speculation_needs_no_draft_model() -> None:
    spec = translated_spec(_speculative_doc({"ngram_size": 3, "max_draft_tokens": 5}, draft=False))
    assert (spec.strategy.kind, spec.strategy.producer) == ("speculative", "ngram")
    assert spec.strategy.params["ngram_size"] == 3
    assert spec.strategy.num_speculative_tokens == 5
    assert spec.strategy.draft_session is None


def test_no_speculative_block_means_standard_strategy() -> None:
    spec = translated_spec(read_v1("models", "smollm2-135m-instruct-int4"))
    assert spec.strategy.kind == "standard"
    assert "strategy" not in translate_v1(read_v1("models", "smollm2-135m-instruct-int4"))


# ------------------------------------------------------------------------------ 05: v1 beside v2


def test_05_v1_and_handwritten_v2_build_the_same_pipeline() -> None:
    folder = require_shared(*EXAMPLES, "05-v1-to-v2")
    v1, v2 = load(folder / "v1"), load(folder / "v2")
    assert v1.flow == v2.flow
    assert v1.dataflow == v2.dataflow
    assert {n: s.file for n, s in v1.sessions.items()} == {
        n: s.file for n, s in v2.sessions.items()
    }
    assert v1.tokens == v2.tokens
    assert v1.generation.max_length == v2.generation.max_length == 512
    assert v1.extends == v2.extends == ("autoregressive-decoder",)
    kv1, kv2 = v1.state.kv_cache, v2.state.kv_cache
    assert (kv1.format, kv1.past_key_pattern, kv1.present_key_pattern) == (
        kv2.format,
        kv2.past_key_pattern,
        kv2.present_key_pattern,
    )
    assert classify(v1) == classify(v2)


# ------------------------------------------------------------------------------ v2 with v1 blocks


def test_v2_document_without_v1_blocks_is_untouched() -> None:
    doc = {"version": 2, "pipeline": {"extends": "autoregressive-decoder"}}
    assert merge_embedded_v1(doc) is doc


def test_embedded_v1_blocks_merge_under_explicit_v2_keys() -> None:
    doc = json.loads(
        require_shared(*GENAI, "speculative-tiny", "target", "genai_config.json").read_text()
    )
    before = copy.deepcopy(doc)
    merged = merge_embedded_v1(doc)
    assert doc == before
    assert {"model", "search"}.isdisjoint(merged)
    sessions = merged["pipeline"]["sessions"]
    # Translated stages and the explicit target/draft sessions side by side.
    assert {"embeddings", "transformer", "language_model_head", "target", "draft"} <= set(sessions)
    assert merged["pipeline"]["strategy"]["kind"] == "speculative"
    assert merged["tokens"]["eos"] == [15]


def test_embedded_v1_pipeline_keeps_its_wires_beside_an_explicit_dataflow() -> None:
    spec = load(
        require_shared(*GENAI, "speculative-tiny", "target-eagle"),
        root=require_shared(*GENAI, "speculative-tiny"),
    )
    pairs = [(w.src, w.dst) for w in spec.dataflow]
    assert ("target", "eagle_draft") in pairs
    assert ("embeddings", "transformer") in pairs
    assert ("transformer", "language_model_head") in pairs


def test_spec_records_that_it_came_from_v1() -> None:
    assert load(require_shared(*GENAI, "dummy-decoder")).source_version == 1
