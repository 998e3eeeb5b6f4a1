"""v1 → v2 translation: a pure function from onnxruntime-genai's builder format to our v2 form.

The output is a v2 document (plain dicts) that validates against the v2 schema and, once
presets are resolved, builds the same PipelineSpec the v1 config describes. Nothing here reads
files; graph-dependent facts (layer counts, KV shapes) are detected later from the real I/O.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from .presets import merge_pipeline

# v1 token-id keys under "model" and their v2 "tokens" names.
_TOKEN_KEYS = {
    "bos_token_id": "bos",
    "pad_token_id": "pad",
    "decoder_start_token_id": "decoder_start",
    "sep_token_id": "sep",
    "image_token_id": "image_token",
    "video_token_id": "video_token",
    "vision_start_token_id": "vision_start_token",
}
# v1 decoder keys that describe KV dimensions.
_KV_DIMS = {"num_hidden_layers": "num_layers", "num_key_value_heads": "num_kv_heads"}
_KV_PATTERNS = {
    ("inputs", "past_key_names"): "past_key_pattern",
    ("inputs", "past_value_names"): "past_value_pattern",
    ("outputs", "present_key_names"): "present_key_pattern",
    ("outputs", "present_value_names"): "present_value_pattern",
}
_SESSION_KEYS = ("session_options", "run_options")


def translate_v1(doc: dict[str, Any]) -> dict[str, Any]:
    """Translate a validated v1 document (``model`` + ``search`` [+ ``speculative``]) to v2."""
    model = doc.get("model", {})
    out: dict[str, Any] = {"version": 2}
    if "$schema" in doc:
        out["$schema"] = doc["$schema"]
    pipeline, notes = _pipeline(model)
    spec = _speculative(model, doc.get("speculative"), pipeline)
    if spec:
        pipeline["strategy"] = spec
    out["pipeline"] = pipeline
    out["tokens"] = _tokens(model)
    out["generation"] = _generation(model, doc.get("search", {}))
    out["metadata"] = {
        key: model[key] for key in ("type", "vocab_size", "context_length") if key in model
    }
    if "type" in out["metadata"]:
        out["metadata"]["model_type"] = out["metadata"].pop("type")
    out["metadata"]["translated_from"] = "v1"
    if notes:
        out["metadata"]["translation_notes"] = notes
    return out


def merge_embedded_v1(doc: dict[str, Any]) -> dict[str, Any]:
    """A v2 document may still carry v1 ``model`` / ``search`` / ``speculative`` blocks.

    Translate those blocks and lay the explicit v2 keys over them: explicit sessions are added
    to (or replace by name) the translated ones, an explicit flow/dataflow replaces the
    translated one, and ``tokens`` / ``generation`` / ``state`` merge key by key.
    """
    if not any(key in doc for key in ("model", "search", "speculative")):
        return doc
    base = translate_v1({k: doc[k] for k in ("model", "search", "speculative") if k in doc})
    explicit = {k: v for k, v in doc.items() if k not in ("model", "search", "speculative")}
    out = copy.deepcopy(base)
    for key, value in explicit.items():
        if key == "pipeline":
            out["pipeline"] = _merge_pipeline(out.get("pipeline", {}), value)
        elif key in ("tokens", "generation", "metadata") and isinstance(value, dict):
            out[key] = {**out.get(key, {}), **copy.deepcopy(value)}
        else:
            out[key] = copy.deepcopy(value)
    return out


def _merge_pipeline(base: dict[str, Any], explicit: dict[str, Any]) -> dict[str, Any]:
    out = merge_pipeline(base, explicit)
    if "extends" in explicit:
        # An explicit preset brings its own flow; the translated one must not shadow it.
        for key in ("flow", "dataflow"):
            if key not in explicit:
                out.pop(key, None)
    elif "dataflow" in explicit and "flow" not in explicit:
        # The flow is still the translated one, so its wires stay; explicit ones are added.
        wires = [w for w in base.get("dataflow", []) if w not in explicit["dataflow"]]
        out["dataflow"] = wires + copy.deepcopy(explicit["dataflow"])
    return out


def session_name(name: str) -> str:
    """A v1 stage name as a v2 session name (no dots: they separate session from tensor)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name) or "stage"


def _tokens(model: dict[str, Any]) -> dict[str, Any]:
    tokens: dict[str, Any] = {}
    if "eos_token_id" in model:
        eos = model["eos_token_id"]
        tokens["eos"] = list(eos) if isinstance(eos, list) else [eos]
    for key, name in _TOKEN_KEYS.items():
        if key in model:
            tokens[name] = model[key]
    return tokens


def _generation(model: dict[str, Any], search: dict[str, Any]) -> dict[str, Any]:
    gen = copy.deepcopy(search)
    # The reference: max_length omitted or 0 means the model's context length.
    if not gen.get("max_length") and model.get("context_length"):
        gen["max_length"] = model["context_length"]
    return gen


def _session(block: dict[str, Any], file: str) -> dict[str, Any]:
    session: dict[str, Any] = {"file": file}
    for key in _SESSION_KEYS:
        if key in block:
            session[key] = copy.deepcopy(block[key])
    for key in ("inputs", "outputs"):
        if isinstance(block.get(key), dict) and block[key]:
            session[key] = dict(block[key])
    return session


def _kv_state(decoder: dict[str, Any]) -> dict[str, Any]:
    kv: dict[str, Any] = {}
    inputs, outputs = decoder.get("inputs", {}), decoder.get("outputs", {})
    if "past_names" in inputs or "present_names" in outputs:
        kv["format"] = "combined"
        if "past_names" in inputs:
            kv["past_key_pattern"] = inputs["past_names"]
        if "present_names" in outputs:
            kv["present_key_pattern"] = outputs["present_names"]
    else:
        for (side, key), name in _KV_PATTERNS.items():
            value = (inputs if side == "inputs" else outputs).get(key)
            if value:
                kv[name] = value
    # 0 is a value (and a wrong one the graph check reports), not "unset".
    for key, name in _KV_DIMS.items():
        if decoder.get(key) is not None:
            kv[name] = decoder[key]
    if decoder.get("head_size") is not None:
        kv["head_size"] = decoder["head_size"]
    if "sliding_window" in decoder:
        kv["sliding_window"] = dict(decoder["sliding_window"])
    return kv


def _pipeline(model: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The v2 pipeline block for a v1 ``model``, and notes on what could not be translated."""
    decoder = model.get("decoder", {})
    sessions: dict[str, Any] = {}
    flow: list[dict[str, Any]] = []
    dataflow: list[dict[str, str]] = []
    extends: str | None = None
    init_sources: list[str] = []

    notes: list[str] = []
    for kind in ("vision", "speech"):
        block = model.get(kind, {})
        loop = "per_image" if kind == "vision" else "batched"
        if block.get("filename"):
            sessions[kind] = _session(block, block["filename"])
            flow.append({"run": kind, "when": "init", "loop": loop})
            init_sources.append(kind)
        elif isinstance(block.get("pipeline"), dict):
            # A staged tower (e.g. patch_embed -> vision_attn -> patch_merger): the v1 config
            # names the files but not the tensors between them, so no wires can be derived.
            for stage, body in block["pipeline"].items():
                name = session_name(f"{kind}_{stage}")
                sessions[name] = _session(body, body.get("filename", ""))
                flow.append({"run": name, "when": "init", "loop": loop})
            notes.append(
                f"model.{kind}.pipeline stages became init sessions without wires between "
                "them (v1 does not name those tensors); add them to pipeline.dataflow"
            )
    if "encoder" in model and model["encoder"].get("filename"):
        sessions["encoder"] = _session(model["encoder"], model["encoder"]["filename"])
        flow.append({"run": "encoder", "when": "init"})
    if "embedding" in model and model["embedding"].get("filename"):
        sessions["embedding"] = _session(model["embedding"], model["embedding"]["filename"])
        flow.append({"run": "embedding", "when": "step"})
        for src in init_sources:
            feature = _first_output(model[src], "image_features" if src == "vision" else None)
            if feature and _has_input(model["embedding"], feature):
                dataflow.append({"from": f"{src}.{feature}", "to": f"embedding.{feature}"})
        embeds = _first_output(model["embedding"], "inputs_embeds")
        target = decoder.get("inputs", {}).get("inputs_embeds", "inputs_embeds")
        if embeds:
            dataflow.append({"from": f"embedding.{embeds}", "to": f"decoder.{target}"})

    stages = _pipeline_stages(decoder)
    if stages:
        names = _add_stages(sessions, flow, dataflow, decoder, stages)
        on_prompt = {n for n, s in zip(names, stages) if s.get("run_on_prompt", True)}
        on_token = {n for n, s in zip(names, stages) if s.get("run_on_token_gen", True)}
        if len(names) == 2 and on_prompt.isdisjoint(on_token):
            extends = "prefill-decode"
    elif decoder.get("filename"):
        sessions["decoder"] = _session(decoder, decoder["filename"])
        step: dict[str, Any] = {"run": "decoder", "when": "step"}
        if "encoder" in sessions:
            step["cross_attention_from"] = "encoder"
            out_name = _first_output(model["encoder"], "encoder_outputs") or "encoder_outputs"
            in_name = decoder.get("inputs", {}).get("encoder_hidden_states")
            if in_name:
                dataflow.append({"from": f"encoder.{out_name}", "to": f"decoder.{in_name}"})
        flow.append(step)

    pipeline: dict[str, Any] = {"sessions": sessions}
    if extends is None and list(sessions) == ["decoder"]:
        extends = "autoregressive-decoder"
    if extends:
        pipeline["extends"] = extends
    if extends != "autoregressive-decoder":
        pipeline["flow"] = flow
        if dataflow:
            pipeline["dataflow"] = dataflow
    state: dict[str, Any] = {}
    kv = _kv_state(decoder)
    if kv:
        state["kv_cache"] = kv
    inputs = decoder.get("inputs", {})
    if "encoder" in sessions and (
        "cross_past_key_names" in inputs or "cross_past_value_names" in inputs
    ):
        state["cross_cache"] = {"source": "encoder", "frozen": True}
    if state:
        pipeline["state"] = state
    return pipeline, notes


def _pipeline_stages(decoder: dict[str, Any]) -> list[dict[str, Any]]:
    """v1 ``decoder.pipeline`` is a list of objects, each holding stages in key order."""
    stages = []
    for group in decoder.get("pipeline", []):
        for name, stage in group.items():
            stages.append({"__name__": name, **stage})
    return stages


def _add_stages(
    sessions: dict[str, Any],
    flow: list[dict[str, Any]],
    dataflow: list[dict[str, str]],
    decoder: dict[str, Any],
    stages: list[dict[str, Any]],
) -> list[str]:
    """Each v1 pipeline stage becomes a step session; a stage output that a later stage lists
    as an input (after ``output_names_forwarder`` renaming) becomes a wire."""
    names: list[str] = []
    produced: dict[str, tuple[str, str]] = {}  # tensor name seen by consumers -> (session, output)
    role_inputs, role_outputs = decoder.get("inputs", {}), decoder.get("outputs", {})
    for stage in stages:
        name = session_name(stage["__name__"])
        names.append(name)
        session: dict[str, Any] = {"file": stage.get("filename", "")}
        for key in _SESSION_KEYS:
            if key in stage:
                session[key] = copy.deepcopy(stage[key])
            elif key in decoder and stage.get("inherit_session_options"):
                session[key] = copy.deepcopy(decoder[key])
        stage_in, stage_out = stage.get("inputs", []), stage.get("outputs", [])
        ins = _roles_for(role_inputs, stage_in)
        outs = _roles_for(role_outputs, stage_out)
        if ins:
            session["inputs"] = ins
        if outs:
            session["outputs"] = outs
        sessions[name] = session
        step: dict[str, Any] = {"run": name, "when": "step"}
        if not stage.get("run_on_prompt", True):
            step["run_on_prompt"] = False
        if not stage.get("run_on_token_gen", True):
            step["run_on_token_gen"] = False
        flow.append(step)
        for tensor in stage_in:
            if tensor in produced:
                src, src_tensor = produced[tensor]
                dataflow.append({"from": f"{src}.{src_tensor}", "to": f"{name}.{tensor}"})
        forward = stage.get("output_names_forwarder", {})
        for tensor in stage_out:
            if _is_kv_name(tensor, role_outputs):
                continue  # present -> past is the KV cache's job, not a wire
            produced[forward.get(tensor, tensor)] = (name, tensor)
    return names


def _roles_for(roles: dict[str, str], tensors: list[str]) -> dict[str, str]:
    """The decoder's role map restricted to the tensors one stage declares."""
    out = {}
    for role, pattern in roles.items():
        if any(_matches(pattern, t) for t in tensors):
            out[role] = pattern
    return out


def _matches(pattern: str, tensor: str) -> bool:
    if "%d" not in pattern:
        return pattern == tensor
    return re.fullmatch(re.escape(pattern).replace("%d", r"\d+"), tensor) is not None


def _is_kv_name(tensor: str, outputs: dict[str, str]) -> bool:
    keys = ("present_key_names", "present_value_names", "present_names")
    defaults = ("present.%d.key", "present.%d.value")
    patterns = [outputs[k] for k in keys if k in outputs] or list(defaults)
    return any(_matches(p, tensor) for p in patterns)


def _first_output(block: dict[str, Any], preferred: str | None) -> str | None:
    outputs = block.get("outputs", {})
    if preferred and preferred in outputs:
        return outputs[preferred]
    return next(iter(outputs.values()), preferred)


def _has_input(block: dict[str, Any], tensor: str) -> bool:
    return tensor in block.get("inputs", {}).values()


def _speculative(
    model: dict[str, Any], speculative: dict[str, Any] | None, pipeline: dict[str, Any]
) -> dict[str, Any] | None:
    """v1 ``model.draft`` + top-level ``speculative`` → a v2 speculative strategy."""
    draft = model.get("draft")
    ngram = (speculative or {}).get("ngram_size", 0)
    if not draft and not ngram:
        return None
    strategy: dict[str, Any] = {"kind": "speculative"}
    params = {k: v for k, v in (speculative or {}).items() if k != "max_draft_tokens"}
    if draft:
        pipeline["sessions"]["draft"] = _session(draft, draft.get("filename", ""))
        strategy["draft"] = {"producer": "draft_model", "session": "draft", **params}
        pipeline.setdefault("roles", {})["draft"] = "draft"
    else:
        strategy["draft"] = {"producer": "ngram", **params}
    target = "decoder" if "decoder" in pipeline["sessions"] else None
    if target:
        strategy["verify"] = {"session": target}
        pipeline.setdefault("roles", {})["target"] = target
    if speculative and "max_draft_tokens" in speculative:
        strategy["num_speculative_tokens"] = speculative["max_draft_tokens"]
    return strategy
