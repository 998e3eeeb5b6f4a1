"""The ``explain`` report: what a config resolves to and how it will run, as data and as text.

Pure functions: ``explain_spec`` reads a PipelineSpec (plus, when the graphs were loaded, the
execution plan) and returns a JSON-ready dict; ``format_report`` renders that dict for people.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from .decoding.chain import make_picker
from .errors import GenaiRuntimeError
from .generation_defaults import defaults_for
from .kv.planning import CACHE_KINDS, FIXED_SHAPE_KINDS, device_obstacle
from .routing import classify
from .runtime.cuda_graphs import graph_obstacle
from .runtime.pipeline import LoadedPipeline
from .runtime.plan import Plan
from .session.device import HOST, Device
from .session.providers import assignment
from .spec import PHASES, GenerationSpec, PipelineSpec
from .speculative import tree_note

__all__ = [
    "explain_model",
    "explain_spec",
    "format_report",
    "providers_text",
    "session_providers",
]

_LAYOUT_SHAPES = {
    "separate": "[B, H, S, D] per key and value",
    "combined": "[2, B, H, S, D] key and value together",
    "scatter": "[B, S, H*D] static, written by scatter",
}


def explain_model(model: Any, *, source: str | None = None, version: int | None = None) -> dict:
    """The report for a loaded ``Model`` (config plus what its graphs declare)."""
    report = explain_spec(model.spec, pipeline=model.pipeline, source=source, version=version)
    speculative = getattr(model, "speculative", None)
    if speculative is not None:  # what the strategy resolved to against the graphs
        report["speculative"] = speculative.describe()
    controller = getattr(model, "controller", None)
    if controller is not None:
        report["controller"] = controller.name
    return report


def explain_spec(
    spec: PipelineSpec,
    *,
    pipeline: LoadedPipeline | None = None,
    source: str | None = None,
    version: int | None = None,
    graph_note: str | None = None,
) -> dict[str, Any]:
    """The report for a spec; ``pipeline`` (its graphs loaded) adds stage inputs and the
    detected KV cache.

    ``graph_note`` says why the graphs were not inspected (shown when ``pipeline`` is None).
    """
    plan = None if pipeline is None else pipeline.plan
    route = classify(spec)
    report: dict[str, Any] = {
        "source": source,
        "version": version,
        "model_type": spec.model.type,
        "route": {"kind": route.kind, "base": route.base, "reasons": list(route.reasons)},
        "presets": list(spec.extends),
        "sessions": _sessions(spec),
        "flow": {phase: [_step(s) for s in spec.steps(phase)] for phase in PHASES},
        "wires": [str(w) for w in spec.dataflow],
        "roles": dict(spec.roles),
        "strategy": _strategy(spec),
        "tokens": _tokens(spec),
        "generation": generation_changes(spec.generation),
        "run_defaults": defaults_for(spec).describe(),
        "chain": decoding_chain(spec, plan),
        "kv_cache_config": _non_default(spec.state.kv_cache),
        "notes": list(spec.metadata.get("translation_notes", ())),
        "graphs": None,
    }
    if pipeline is not None:
        note = tree_note(pipeline)
        if note:
            report["speculative"] = [note]
        report["graphs"] = {
            "stages": [_stage(stage, pipeline) for stage in plan.stages],
            "vocab_size": plan.vocab_size,
            "kv_cache": _kv(pipeline),
            "cross_cache": None
            if plan.cross is None
            else {"source": plan.cross.source, "tensors": len(plan.cross.pairs)},
        }
    elif graph_note:
        report["graphs_note"] = graph_note
    return report


def generation_changes(generation: GenerationSpec) -> dict[str, Any]:
    """Generation settings whose value differs from onnxruntime-genai's defaults."""
    default = GenerationSpec()
    out: dict[str, Any] = {}
    for f in dataclasses.fields(GenerationSpec):
        value = getattr(generation, f.name)
        if value == getattr(default, f.name):
            continue
        if f.name == "logits":
            value = [{"op": p.kind, **dict(p.params)} for p in value]
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def decoding_chain(spec: PipelineSpec, plan: Plan | None = None) -> list[str]:
    """The logits ops and the terminal, in the order they will run for this config."""
    vocab = (plan.vocab_size if plan is not None else None) or spec.model.vocab_size
    try:
        decoder = make_picker(
            spec.generation, eos_token_ids=spec.tokens.eos, vocab_size=vocab or 2**31 - 1
        )
    except GenaiRuntimeError as error:
        return [f"invalid: {error}"]
    return decoder.describe()


# -- pieces of the report ------------------------------------------------------------------


def _sessions(spec: PipelineSpec) -> dict[str, dict[str, Any]]:
    roles = {session: role for role, session in spec.roles.items()}
    out = {}
    for name, session in spec.sessions.items():
        steps = [s for s in spec.flow if s.run == name]
        providers = [p.name for p in session.options.providers if p.name] or ["cpu"]
        out[name] = {
            "file": session.file,
            "phases": list(dict.fromkeys(s.when for s in steps)),
            "run_on_prompt": any(s.run_on_prompt for s in steps) if steps else None,
            "run_on_token_gen": any(s.run_on_token_gen for s in steps) if steps else None,
            "providers": providers,
            "role": roles.get(name),
        }
    return out


def _step(step: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"run": step.run}
    if step.loop:
        out["loop"] = step.loop
    if step.cross_attention_from:
        out["cross_attention_from"] = step.cross_attention_from
    if not step.run_on_prompt:
        out["run_on_prompt"] = False
    if not step.run_on_token_gen:
        out["run_on_token_gen"] = False
    return out


def _strategy(spec: PipelineSpec) -> dict[str, Any] | None:
    if spec.strategy.kind == "standard":
        return None
    out = _non_default(spec.strategy)
    out["kind"] = spec.strategy.kind
    return out


def _tokens(spec: PipelineSpec) -> dict[str, Any]:
    t = spec.tokens
    out: dict[str, Any] = {"bos": t.bos, "eos": list(t.eos), "pad": t.pad}
    if t.decoder_start is not None:
        out["decoder_start"] = t.decoder_start
    out.update(dict(t.extra))
    return out


def _non_default(obj: Any) -> dict[str, Any]:
    """A frozen dataclass's fields that are set (not None and not their default)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        default = f.default if f.default is not dataclasses.MISSING else None
        if value is None or value == default or (isinstance(value, Mapping) and not value):
            continue
        out[f.name] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    """JSON-ready form of spec values (mappings, tuples, nested dataclasses)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _stage(stage: Any, pipeline: LoadedPipeline) -> dict[str, Any]:
    inputs = []
    for feed in stage.feeds:
        entry: dict[str, Any] = {
            "name": feed.name,
            "type": feed.info.type,
            "shape": list(feed.info.shape),
            "source": feed.source,
        }
        if feed.role:
            entry["role"] = feed.role
        if feed.wire:
            entry["wire"] = str(feed.wire)
        inputs.append(entry)
    session = pipeline.sessions[stage.name]
    return {
        "session": stage.name,
        "file": stage.io.file,
        "phase": stage.step.when,
        "device": str(Device.of(session)),
        "providers": session_providers(session),
        "inputs": inputs,
        "logits": stage.logits.name if stage.logits is not None else None,
        "wire_outputs": list(stage.wire_outputs),
    }


def session_providers(session: Any) -> list[dict[str, Any]]:
    """The providers onnxruntime gave the session, in its order, with the nodes each took where
    onnxruntime recorded them (sessions that asked for a provider besides the CPU's)."""
    assigned = assignment(session)
    if assigned is None:
        return [{"name": name} for name in session.get_providers()]
    return [{"name": a.provider, "nodes": a.nodes, "parts": a.parts} for a in assigned]


def providers_text(providers: list[Mapping[str, Any]]) -> str:
    """``OpenVINOExecutionProvider (all 90 nodes)``, or each provider's share of the nodes."""
    names = [p["name"] for p in providers]
    if any("nodes" not in p for p in providers):
        return ", ".join(names)
    taken = [p for p in providers if p["nodes"]]
    total = sum(p["nodes"] for p in providers)
    if len(taken) == 1:
        idle = [p["name"] for p in providers if not p["nodes"]]
        rest = f"; none on {', '.join(idle)}" if idle else ""
        return f"{taken[0]['name']} (all {total} nodes{rest})"
    shares = []
    for p in providers:
        parts = p["parts"] if p["name"] != "CPUExecutionProvider" else 0
        split = f" in {parts} parts" if parts > 1 else ""
        shares.append(f"{p['name']} {p['nodes']} nodes{split}")
    return ", ".join(shares) + " (a partition: the graph is split between them)"


def prompt_cache_note(kind: str | None, device: Device) -> str:
    """Whether the server's prompt cache works for a KV cache ``kind`` on ``device``, and why
    not: it copies a prompt's rows out of a request's slot and into another's, which each kind
    declares it can or cannot do."""
    if kind is None:
        return "no: no cache kind handles this layout"
    kind_class = CACHE_KINDS[kind]
    if not kind_class.can_copy_rows:
        return f"no: {kind_class.cannot_copy}"
    if not device.host and not kind_class.copies_from_device:
        return f"no: the rows live on {device}; the prompt cache copies rows held on the host"
    return "yes (serve --prompt-cache-mb; requests with a LoRA adapter do not use it)"


def _kv(pipeline: LoadedPipeline) -> dict[str, Any] | None:
    layout = pipeline.plan.layout
    if layout is None:
        return None
    out: dict[str, Any] = {
        "file": layout.file,
        "format": layout.format,
        "pattern": layout.pattern,
        "past": list(layout.past[0]) if layout.past else [],
        "present": list(layout.present[0]) if layout.present else [],
        "num_layers": layout.num_layers,
        "num_kv_heads": layout.num_kv_heads,
        "head_size": layout.head_size,
        "dtype": str(layout.dtype),
        "bytes_per_token": layout.bytes_per_token(1),
        "static_capacity": layout.static_capacity,
        "drivers": dict(layout.drivers),
        "window": layout.window,
        "window_layers": list(layout.window_layers),
    }
    devices = {Device.of(pipeline.sessions[s.name]) for s in pipeline.plan.stages if s.layout}
    device = devices.pop() if len(devices) == 1 else HOST
    out["device"] = str(device)
    try:
        kv_plan = pipeline.kv_plan()
        out["kind"], out["reason"] = kv_plan.kind, kv_plan.reason
        out["device_obstacle"] = device_obstacle(kv_plan.kind, device)
        if not device.host:
            static_mask = CACHE_KINDS[kv_plan.kind].static_mask
            obstacle = graph_obstacle(
                list(pipeline.plan.stages), pipeline.sessions, kv_plan.kind, static_mask
            )
            out["cuda_graph"] = (
                "on: decode steps captured, then replayed"
                if obstacle is None
                else f"off: {obstacle}"
            )
    except GenaiRuntimeError as exc:  # the layout is real even when no cache kind handles it
        out["kind"], out["reason"] = None, str(exc)
    out["prompt_cache"] = prompt_cache_note(out["kind"], device)
    return out


# -- text ------------------------------------------------------------------------------------


def format_report(report: Mapping[str, Any]) -> str:
    """The report as aligned, human-readable text."""
    lines: list[str] = []
    add = lines.append
    version = f"v{report['version']}" if report.get("version") else "config"
    head = f"config: {report.get('source') or '(in memory)'} ({version}"
    add(head + (f", model type {report['model_type']})" if report.get("model_type") else ")"))

    route = report["route"]
    add(f"route: {route['kind']}" + (f" (over {route['base']})" if route.get("base") else ""))
    lines += [f"  - {reason}" for reason in route["reasons"]]
    add(f"presets: {' -> '.join(report['presets']) if report['presets'] else '(none)'}")

    add("sessions:")
    for name, s in report["sessions"].items():
        phases = ", ".join(s["phases"]) or "not in flow"
        bits = [f"file {s['file']}", f"phase {phases}"]
        if s["phases"]:
            bits.append(f"run_on_prompt {_yes(s['run_on_prompt'])}")
            bits.append(f"run_on_token_gen {_yes(s['run_on_token_gen'])}")
        bits.append(f"providers {', '.join(s['providers'])}")
        if s.get("role"):
            bits.append(f"role {s['role']}")
        add(f"  {name}: " + "; ".join(bits))

    add("flow:")
    for phase in PHASES:
        steps = report["flow"][phase]
        add(f"  {phase + ':':<6} " + (", ".join(_step_text(s) for s in steps) or "(none)"))
    add("wires:" + ("" if report["wires"] else " (none)"))
    lines += [f"  {w}" for w in report["wires"]]
    if report.get("roles"):
        add("roles: " + ", ".join(f"{k} = {v}" for k, v in report["roles"].items()))
    if report.get("strategy"):
        add("strategy: " + _pairs(report["strategy"]))
    lines += [f"  speculative: {line}" for line in report.get("speculative", ())]
    if report.get("controller"):
        add(f"controller: {report['controller']} drives the decode loop (trusted code)")
    add("tokens: " + _pairs(report["tokens"]))
    add("generation (differs from defaults): " + (_pairs(report["generation"]) or "(none)"))
    if report.get("run_defaults"):
        add("run and chat, with no sampling or length flag: " + report["run_defaults"])
    if report.get("chain"):
        add("decoding chain: " + " -> ".join(report["chain"]))
    lines += [f"note: {note}" for note in report.get("notes", ())]

    graphs = report.get("graphs")
    if graphs is None:
        if report.get("kv_cache_config"):
            add("kv cache (configured): " + _pairs(report["kv_cache_config"]))
        add(f"graphs: not inspected ({report.get('graphs_note') or 'config only'})")
        return "\n".join(lines) + "\n"

    add("stages:")
    for stage in graphs["stages"]:
        where = f", on {stage['device']}" if stage.get("device") else ""
        add(f"  {stage['session']} ({stage['file']}, {stage['phase']}{where}):")
        if stage.get("providers"):
            add(f"    providers: {providers_text(stage['providers'])}")
        kv = [i for i in stage["inputs"] if i["source"] == "kv"]
        cross = [i for i in stage["inputs"] if i["source"] == "cross"]
        rows = [
            (i["name"], _tensor(i), _source(i))
            for i in stage["inputs"]
            if i not in kv and i not in cross
        ]
        w1 = max((len(r[0]) for r in rows), default=0)
        w2 = max((len(r[1]) for r in rows), default=0)
        lines += [f"    {name:<{w1}}  {tensor:<{w2}}  <- {source}" for name, tensor, source in rows]
        if kv:
            add(f"    {len(kv)} KV inputs ({kv[0]['name']} ... {kv[-1]['name']})  <- kv cache")
        if cross:
            add(
                f"    {len(cross)} cross-attention inputs ({cross[0]['name']} ... "
                f"{cross[-1]['name']})  <- cross cache, bound once per init run"
            )
        if stage["logits"]:
            add(f"    -> logits: {stage['logits']}")
        if stage["wire_outputs"]:
            add(f"    -> wired outputs: {', '.join(stage['wire_outputs'])}")

    kv = graphs.get("kv_cache")
    if kv is None:
        add("kv cache: none detected")
    else:
        add(f"kv cache (detected from {kv['file']}):")
        names = ", ".join(kv["past"])
        add(f"  format:    {kv['format']} {_LAYOUT_SHAPES[kv['format']]} ({names} ...)")
        add(f"  layers:    {kv['num_layers']}")
        add(f"  heads:     {kv['num_kv_heads']} (KV heads)")
        add(f"  head size: {kv['head_size']}")
        add(f"  dtype:     {kv['dtype']} ({kv['bytes_per_token']} bytes per token, batch 1)")
        if kv.get("static_capacity"):
            add(f"  capacity:  {kv['static_capacity']} tokens (fixed by the graph)")
        if kv.get("drivers"):
            add(f"  drivers:   {', '.join(kv['drivers'].values())} (fed by the cache)")
        if kv.get("window"):
            which = kv["window_layers"] or "all"
            add(f"  window:    {kv['window']} tokens on layers {which}")
        kind = kv["kind"] or "unavailable"
        add(f"  kind:      {kind} ({kv['reason']})")
        if kv.get("device"):
            held = "buffers bound once as past and present" if kv["device"] != "cpu" else "host"
            if kv["device"] != "cpu" and kv["kind"] in FIXED_SHAPE_KINDS:
                held = "past buffers bound once; each chunk's new rows written into them there"
            add(f"  lives on:  {kv['device']} ({held})")
        if kv.get("device_obstacle"):
            add(f"  device:    {kv['device_obstacle']}")
        if kv.get("cuda_graph"):
            add(f"  cuda graph: {kv['cuda_graph']}")
        if kv.get("prompt_cache"):
            add(f"  prompt cache (server): {kv['prompt_cache']}")
    return "\n".join(lines) + "\n"


def _yes(flag: bool | None) -> str:
    return "yes" if flag else "no"


def _step_text(step: Mapping[str, Any]) -> str:
    extras = [f"{k}={v}" for k, v in step.items() if k != "run"]
    return step["run"] + (f" [{', '.join(extras)}]" if extras else "")


def _pairs(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {_value(v)}" for k, v in values.items() if v is not None)


def _value(value: Any) -> str:
    """Values as the config spells them (true, not True)."""
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _tensor(entry: Mapping[str, Any]) -> str:
    kind = entry["type"].removeprefix("tensor(").removesuffix(")")
    dims = ", ".join("?" if d is None else str(d) for d in entry["shape"])
    return f"{kind}[{dims}]"


def _source(entry: Mapping[str, Any]) -> str:
    if entry["source"] == "role":
        return f"role {entry['role']}"
    if entry["source"] == "wire":
        return f"wire {entry['wire']}"
    return "user-supplied (set_model_input)"
