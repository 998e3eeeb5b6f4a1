"""The router classifies by shape only: sessions, phases, wires, cross-attention, strategy.

A model type string (v2 ``metadata.model_type``, v1 ``model.type``) never changes the route.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genai_runtime.config import to_v2
from genai_runtime.config.build import build_spec
from genai_runtime.config.flow import check_flow
from genai_runtime.config.loader import config_version, validate_document
from genai_runtime.config.presets import resolve_presets
from genai_runtime.routing import ROUTES, Route, classify
from genai_runtime.spec import PipelineSpec

UNKNOWN_TYPE = "totally-new-arch"
# Type strings that name other shapes in onnxruntime-genai: they must not pull the route.
MISLEADING_TYPES = ["whisper", "phi3v", "qwen2_5_vl", "marian-ssru", "decoder-pipeline", "gpt2"]

_KV_IO = {
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
}

# v1 documents of every shape the builder writes (small stand-ins for the real fixtures).
V1_DOCS: dict[str, dict[str, Any]] = {
    "decoder": {
        "model": {
            "type": "llama",
            "eos_token_id": 2,
            "context_length": 128,
            "decoder": {"filename": "model.onnx", "num_hidden_layers": 2, **_KV_IO},
        },
        "search": {"max_length": 64},
    },
    "decoder-pipeline": {
        "model": {
            "type": "decoder-pipeline",
            "eos_token_id": 2,
            "context_length": 64,
            "decoder": {
                **_KV_IO,
                "pipeline": [
                    {
                        "embeddings": {
                            "filename": "embeds.onnx",
                            "inputs": ["input_ids"],
                            "outputs": ["inputs_embeds"],
                        },
                        "transformer": {
                            "filename": "transformer.onnx",
                            "inputs": ["inputs_embeds", "past_key_values.0.key"],
                            "outputs": ["logits", "present.0.key"],
                        },
                    }
                ],
            },
        }
    },
    "encoder-decoder": {
        "model": {
            "type": "whisper",
            "eos_token_id": 0,
            "context_length": 448,
            "encoder": {"filename": "encoder.onnx", "outputs": {"encoder_outputs": "enc_out"}},
            "decoder": {
                "filename": "decoder.onnx",
                "inputs": {"encoder_hidden_states": "encoder_hidden_states"},
            },
        }
    },
    "multimodal": {
        "model": {
            "type": "phi3v",
            "eos_token_id": 1,
            "context_length": 4096,
            "vision": {
                "filename": "vision.onnx",
                "outputs": {"image_features": "image_features"},
            },
            "embedding": {
                "filename": "embedding.onnx",
                "inputs": {"input_ids": "input_ids", "image_features": "image_features"},
                "outputs": {"inputs_embeds": "inputs_embeds"},
            },
            "decoder": {"filename": "text.onnx", "inputs": {"inputs_embeds": "inputs_embeds"}},
        }
    },
}


def _v2(pipeline: dict[str, Any]) -> dict[str, Any]:
    return {"version": 2, "pipeline": pipeline, "metadata": {"model_type": "llama"}}


# v2 documents of every route, with the structural facts their reasons must state.
V2_DOCS: dict[str, tuple[dict[str, Any], str, str | None, list[str]]] = {
    "decoder": (
        _v2({"extends": "autoregressive-decoder"}),
        "decoder",
        None,
        ["1 session(s) run every step: decoder", "no init stage and no cross-attention"],
    ),
    "decoder-pipeline": (
        _v2({"extends": "decoder-pipeline"}),
        "decoder-pipeline",
        None,
        [
            "3 session(s) run every step: embeddings, transformer, lm_head",
            "stages chained by wires: embeddings.inputs_embeds -> transformer.inputs_embeds; "
            "transformer.hidden_states -> lm_head.hidden_states",
        ],
    ),
    "prefill-decode": (
        _v2({"extends": "prefill-decode"}),
        "prefill-decode",
        None,
        ["prefill runs on the prompt only; decode on new tokens only"],
    ),
    "encoder-decoder": (
        _v2({"extends": "encoder-decoder"}),
        "encoder-decoder",
        None,
        [
            "run once per input (init): encoder",
            "'decoder' cross-attends to the output of 'encoder'",
        ],
    ),
    "multimodal": (
        _v2({"extends": "vision-language"}),
        "multimodal",
        None,
        ["run once per input (init): vision", "init outputs are wired into: embedding"],
    ),
    "speculative": (
        _v2({"extends": "speculative-draft-target"}),
        "speculative",
        "decoder",
        [
            "strategy.kind is speculative: draft_model session 'draft' proposes 4 tokens, "
            "'decoder' verifies",
            "a single autoregressive decoder",
        ],
    ),
    "plugin": (
        _v2(
            {
                "plugin": {"library": "libmine.so", "entry_point": "Create"},
                "sessions": {"decoder": {"file": "model.onnx"}},
            }
        ),
        "plugin",
        "none",  # no flow of its own: the plugin drives execution
        ["pipeline.plugin loads 'libmine.so'", "no stage runs in phase 'step'"],
    ),
}


def spec_of(doc: dict[str, Any]) -> PipelineSpec:
    """Any-version document -> checked spec (no files are read)."""
    version = config_version(doc)
    validate_document(doc, version)
    resolved, chain = resolve_presets(to_v2(doc, version))
    validate_document(resolved, 2)
    spec = build_spec(resolved, None, chain)
    check_flow(spec)
    return spec


def with_type(doc: dict[str, Any], type_string: str) -> dict[str, Any]:
    """The same document with only its model type string changed."""
    out = copy.deepcopy(doc)
    if config_version(out) == 1:
        out["model"]["type"] = type_string
    else:
        out.setdefault("metadata", {})["model_type"] = type_string
    return out


ALL_DOCS = {
    **{f"v1-{k}": v for k, v in V1_DOCS.items()},
    **{f"v2-{k}": v[0] for k, v in V2_DOCS.items()},
}


def test_every_route_kind_is_covered() -> None:
    assert set(V2_DOCS) == set(ROUTES)


# ------------------------------------------------------------------------------ type strings


@pytest.mark.parametrize("doc", [V1_DOCS["decoder"], V2_DOCS["decoder"][0]], ids=["v1", "v2"])
def test_unknown_model_type_still_routes_to_decoder(doc: dict[str, Any]) -> None:
    spec = spec_of(with_type(doc, UNKNOWN_TYPE))
    assert spec.model.type == UNKNOWN_TYPE  # kept for people to read...
    assert classify(spec).kind == "decoder"  # ...and never routed on


def test_missing_model_type_routes_the_same() -> None:
    doc = copy.deepcopy(V1_DOCS["decoder"])
    del doc["model"]["type"]
    assert classify(spec_of(doc)) == classify(spec_of(V1_DOCS["decoder"]))


@pytest.mark.parametrize("name", sorted(ALL_DOCS))
@pytest.mark.parametrize("type_string", MISLEADING_TYPES)
def test_type_strings_of_other_shapes_do_not_change_the_route(name: str, type_string: str) -> None:
    doc = ALL_DOCS[name]
    assert classify(spec_of(with_type(doc, type_string))) == classify(spec_of(doc))


@settings(max_examples=60, deadline=None, database=None)
@given(
    name=st.sampled_from(sorted(ALL_DOCS)),
    type_string=st.one_of(st.text(max_size=40), st.sampled_from(MISLEADING_TYPES)),
)
def test_changing_only_the_type_string_never_changes_the_route(name: str, type_string: str) -> None:
    doc = ALL_DOCS[name]
    assert classify(spec_of(with_type(doc, type_string))) == classify(spec_of(doc))


# ------------------------------------------------------------------------------ shapes and reasons


@pytest.mark.parametrize("name", sorted(V2_DOCS))
def test_route_and_reasons_state_the_structure(name: str) -> None:
    doc, kind, base, facts = V2_DOCS[name]
    route = classify(spec_of(doc))
    assert (route.kind, route.base) == (kind, base)
    text = "\n".join(route.reasons)
    for fact in facts:
        assert fact in text


@pytest.mark.parametrize("name", sorted(V1_DOCS))
def test_v1_shapes_route_by_structure(name: str) -> None:
    assert classify(spec_of(V1_DOCS[name])).kind == name


def test_route_str_names_the_base_shape() -> None:
    assert str(classify(spec_of(V2_DOCS["speculative"][0]))) == "speculative (over decoder)"
    assert str(Route("decoder", ())) == "decoder"


def test_cross_cache_alone_makes_an_encoder_decoder() -> None:
    """No cross_attention_from on the step, but a cross cache written by the encoder."""
    doc = _v2(
        {
            "sessions": {"enc": {"file": "e.onnx"}, "dec": {"file": "d.onnx"}},
            "flow": [{"run": "enc", "when": "init"}, {"run": "dec", "when": "step"}],
            "state": {"cross_cache": {"source": "enc"}},
        }
    )
    route = classify(spec_of(doc))
    assert route.kind == "encoder-decoder"
    assert "'dec' cross-attends to the output of 'enc'" in route.reasons


def test_init_stage_without_cross_attention_is_multimodal() -> None:
    doc = _v2(
        {
            "sessions": {"audio": {"file": "a.onnx"}, "lm": {"file": "lm.onnx"}},
            "flow": [{"run": "audio", "when": "init"}, {"run": "lm", "when": "step"}],
            "dataflow": [{"from": "audio.features", "to": "lm.audio_embeds"}],
        }
    )
    route = classify(spec_of(doc))
    assert route.kind == "multimodal"
    assert "init outputs are wired into: lm" in route.reasons


def test_two_step_stages_without_a_prompt_split_are_a_pipeline() -> None:
    doc = _v2(
        {
            "sessions": {"a": {"file": "a.onnx"}, "b": {"file": "b.onnx"}},
            "flow": [{"run": "a"}, {"run": "b"}],
            "dataflow": [{"from": "a.h", "to": "b.h"}],
        }
    )
    route = classify(spec_of(doc))
    assert route.kind == "decoder-pipeline"
    assert "stages chained by wires: a.h -> b.h" in route.reasons


def test_prompt_only_stage_alone_is_not_prefill_decode() -> None:
    """prefill-decode needs both a prompt-only and a token-only stage."""
    doc = _v2(
        {
            "sessions": {"a": {"file": "a.onnx"}, "b": {"file": "b.onnx"}},
            "flow": [{"run": "a", "run_on_token_gen": False}, {"run": "b"}],
        }
    )
    assert classify(spec_of(doc)).kind == "decoder-pipeline"


def test_speculative_ngram_route_names_the_producer() -> None:
    doc = _v2(
        {
            "extends": "autoregressive-decoder",
            "strategy": {
                "kind": "speculative",
                "draft": {"producer": "ngram", "ngram_size": 3},
                "num_speculative_tokens": 6,
            },
        }
    )
    route = classify(spec_of(doc))
    assert (route.kind, route.base) == ("speculative", "decoder")
    assert route.reasons[0] == "strategy.kind is speculative: ngram proposes 6 tokens"
