"""Build the frozen PipelineSpec from a validated, preset-resolved v2 document."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..spec import (
    DEFAULT_MAX_STAGES,
    BuildRequires,
    CrossCacheSpec,
    FlowStep,
    GenerationSpec,
    KVCacheSpec,
    ModelInfo,
    PipelineSpec,
    PluginSpec,
    PositionSpec,
    ProcessorSpec,
    ProviderSpec,
    SessionOptionsSpec,
    SessionSpec,
    SlidingWindowSpec,
    StateSpec,
    StrategySpec,
    TokensSpec,
    Wire,
    frozen_map,
)

# session_options keys with a typed field; every other scalar becomes an ORT config entry.
_TYPED_OPTIONS = {
    "intra_op_num_threads",
    "inter_op_num_threads",
    "graph_optimization_level",
    "execution_mode",
    "enable_cpu_mem_arena",
    "enable_mem_pattern",
    "enable_profiling",
    "log_id",
    "log_severity_level",
    "log_verbosity_level",
    "custom_ops_library",
}
_GENERATION_FIELDS = set(GenerationSpec.__dataclass_fields__) - {"logits", "stop"}
_TOKEN_FIELDS = ("bos", "eos", "pad", "decoder_start")


def build_spec(
    doc: dict[str, Any],
    model_dir: Path | None = None,
    extends: Sequence[str] = (),
    source_version: int = 2,
    root: Path | None = None,
) -> PipelineSpec:
    pipeline = doc.get("pipeline", {})
    sessions = {name: _session(name, body) for name, body in pipeline.get("sessions", {}).items()}
    model = ModelInfo(
        type=doc.get("metadata", {}).get("model_type"),
        vocab_size=doc.get("metadata", {}).get("vocab_size"),
        context_length=doc.get("metadata", {}).get("context_length"),
    )
    generation = _generation(doc.get("generation", {}))
    if generation.max_length == 0 and model.context_length:
        generation = GenerationSpec(**{**_fields(generation), "max_length": model.context_length})
    return PipelineSpec(
        sessions=frozen_map(sessions),
        flow=tuple(FlowStep(**step) for step in pipeline.get("flow", [])),
        dataflow=tuple(parse_wire(w["from"], w["to"]) for w in pipeline.get("dataflow", [])),
        state=_state(pipeline.get("state", {})),
        roles=frozen_map(pipeline.get("roles", {})),
        strategy=_strategy(pipeline.get("strategy")),
        controller=_plugin(pipeline.get("controller")),
        plugin=_plugin(pipeline.get("plugin")),
        tokens=_tokens(doc.get("tokens", {})),
        generation=generation,
        model=model,
        metadata=frozen_map(doc.get("metadata", {})),
        max_stages=pipeline.get("max_stages", DEFAULT_MAX_STAGES),
        extends=tuple(extends),
        model_dir=model_dir,
        root=root,
        source_version=source_version,
    )


def parse_wire(src: str, dst: str) -> Wire:
    """``"session.tensor"``: the session is everything before the first dot."""
    s_name, _, s_tensor = src.partition(".")
    d_name, _, d_tensor = dst.partition(".")
    return Wire(s_name, s_tensor, d_name, d_tensor)


def _fields(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}


def session_options(raw: dict[str, Any] | None, run_options: dict | None = None):
    raw = dict(raw or {})
    runtime = raw.pop("runtime", {})
    requires = raw.pop("build_requires", {})
    providers = []
    for entry in raw.pop("provider_options", []):
        for name, options in entry.items():
            providers.append(
                ProviderSpec(name, frozen_map({k: str(v) for k, v in options.items()}))
            )
    typed = {k: v for k, v in raw.items() if k in _TYPED_OPTIONS}
    typed.update({k: v for k, v in runtime.items() if k in _TYPED_OPTIONS})
    entries = {k: str(v) for k, v in raw.items() if k not in _TYPED_OPTIONS}
    return SessionOptionsSpec(
        **typed,
        providers=tuple(providers),
        config_entries=frozen_map(entries),
        run_options=frozen_map({k: str(v) for k, v in (run_options or {}).items()}),
        build_requires=BuildRequires(
            onnxruntime=requires.get("onnxruntime"),
            providers=tuple(requires.get("providers", ())),
        ),
    )


def _session(name: str, body: dict[str, Any]) -> SessionSpec:
    return SessionSpec(
        name=name,
        file=body["file"],
        options=session_options(body.get("session_options"), body.get("run_options")),
        inputs=frozen_map(body.get("inputs", {})),
        outputs=frozen_map(body.get("outputs", {})),
    )


def _state(raw: dict[str, Any]) -> StateSpec:
    kv = dict(raw.get("kv_cache", {}))
    if "sliding_window" in kv:
        window = dict(kv["sliding_window"])
        window["layers"] = tuple(window.get("layers", ()))
        kv["sliding_window"] = SlidingWindowSpec(**window)
    cross = raw.get("cross_cache")
    return StateSpec(
        kv_cache=KVCacheSpec(**kv),
        cross_cache=CrossCacheSpec(**cross) if cross else None,
        position_ids=PositionSpec(**raw.get("position_ids", {})),
    )


def _tokens(raw: dict[str, Any]) -> TokensSpec:
    eos = raw.get("eos", ())
    return TokensSpec(
        bos=raw.get("bos"),
        eos=tuple(eos) if isinstance(eos, list) else (eos,) if isinstance(eos, int) else (),
        pad=raw.get("pad"),
        decoder_start=raw.get("decoder_start"),
        extra=frozen_map({k: v for k, v in raw.items() if k not in _TOKEN_FIELDS}),
    )


def _generation(raw: dict[str, Any]) -> GenerationSpec:
    values = {k: v for k, v in raw.items() if k in _GENERATION_FIELDS}
    sampling = raw.get("sampling")
    if sampling is not None:
        values.update(sampling)
        # A sampling block asks for sampling unless it (or the top level) says otherwise.
        values.setdefault("do_sample", raw.get("do_sample", True))
    values.pop("blank_penalty", None)
    logits = tuple(
        ProcessorSpec(kind=p["op"], params=frozen_map({k: v for k, v in p.items() if k != "op"}))
        for p in raw.get("logits", [])
    )
    generation = GenerationSpec(**values, logits=logits, stop=tuple(raw.get("stop", ())))
    if logits:
        from ..decoding.chain import check_chain

        check_chain(generation)  # unknown ops, bad values, contradictions: at their JSON paths
    return generation


def _strategy(raw: dict[str, Any] | None) -> StrategySpec:
    if not raw:
        return StrategySpec()
    draft = dict(raw.get("draft", {}))
    producer = draft.pop("producer", None)
    draft_session = draft.pop("session", None)
    params = dict(draft)
    if "tree" in raw:
        params["tree"] = raw["tree"]
    return StrategySpec(
        kind=raw.get("kind", "standard"),
        producer=producer,
        draft_session=draft_session,
        verify_session=raw.get("verify", {}).get("session"),
        num_speculative_tokens=raw.get("num_speculative_tokens", 4),
        acceptance=raw.get("acceptance", "auto"),
        params=frozen_map(params),
    )


def _plugin(raw: dict[str, Any] | None) -> PluginSpec | None:
    if not raw:
        return None
    known = {"library", "entry_point", "module"}
    params = dict(raw.get("params", {}))
    if "factory" in raw:
        params["factory"] = raw["factory"]
    return PluginSpec(**{k: v for k, v in raw.items() if k in known}, params=frozen_map(params))
