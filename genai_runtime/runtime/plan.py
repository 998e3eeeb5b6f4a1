"""The execution plan: for every stage, where each graph input comes from and where each output
goes, resolved once against the real graph I/O. Mismatches name the file and the tensor."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ModelError
from ..kv import KNOWN_PATTERNS, KVLayout, configured_kv_pattern, detect_layout
from ..kv.cross import CrossLayout, detect_cross
from ..session.graph_io import SessionIO, TensorInfo
from ..spec import FlowStep, PipelineSpec, SessionSpec, Wire

# Roles the runtime fills itself, with onnxruntime-genai's default tensor names.
INPUT_ROLES = {
    "input_ids": "input_ids",
    "inputs_embeds": "inputs_embeds",
    "attention_mask": "attention_mask",
    "position_ids": "position_ids",
    # The slot each new token's K/V takes (fixed-shape caches; elsewhere its position).
    "cache_position": "cache_position",
    "past_sequence_length": "past_sequence_length",
    "current_sequence_length": "current_sequence_length",
    "total_sequence_length": "total_sequence_length",
    "past_key_values_length": "past_key_values_length",
    # Encoder-decoders over text: the encoder's mask, seen by the decoder.
    "encoder_attention_mask": "encoder_attention_mask",
    # A recurrent state: zeros on the first pass, then the stage's own output of the last pass.
    "rnn_states_prev": "rnn_states_prev",
}
SCALAR_ROLES = (
    "past_sequence_length",
    "current_sequence_length",
    "total_sequence_length",
    "past_key_values_length",
)
OUTPUT_ROLES = {"logits": "logits", "rnn_states": "rnn_states"}
# Recurrent input role -> the output role that feeds it on the next pass.
RECURRENT_ROLES = {"rnn_states_prev": "rnn_states"}
# Role-map keys that name KV patterns or other state, not single tensors checked here.
_PATTERN_ROLES = {
    "past_key_names",
    "past_value_names",
    "past_names",
    "present_key_names",
    "present_value_names",
    "present_names",
    "cross_past_key_names",
    "cross_past_value_names",
    "output_cross_qk_names",
}


@dataclass(frozen=True)
class Feed:
    """One graph input and its source: a role the runtime computes, a wire, the KV cache, or a
    tensor the user must supply with ``set_model_input``."""

    name: str
    source: str  # "role" | "wire" | "kv" | "cross" | "user"
    info: TensorInfo
    role: str | None = None
    wire: Wire | None = None


@dataclass(frozen=True)
class StagePlan:
    step: FlowStep
    session: SessionSpec
    io: SessionIO
    feeds: tuple[Feed, ...]
    layout: KVLayout | None
    logits: TensorInfo | None  # set on the stage whose output is the model's logits
    wire_outputs: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.session.name

    def feeds_from(self, source: str) -> tuple[Feed, ...]:
        return tuple(f for f in self.feeds if f.source == source)


@dataclass(frozen=True)
class Plan:
    stages: tuple[StagePlan, ...]
    layout: KVLayout | None
    vocab_size: int | None
    cross: CrossLayout | None = None


def role_name(session: SessionSpec, role: str) -> str:
    table = INPUT_ROLES if role in INPUT_ROLES else OUTPUT_ROLES
    return session.inputs.get(role) or session.outputs.get(role) or table[role]


def build_plan(
    spec: PipelineSpec, ios: Mapping[str, SessionIO], *, require_logits: bool = True
) -> Plan:
    """Resolve every stage's inputs and outputs against the graphs; raise ModelError on a
    mismatch (wire endpoint, renamed role tensor or configured KV name the graph lacks).

    ``require_logits=False`` accepts a pipeline with no logits output (e.g. a builder export
    with ``exclude_lm_head``): it loads, and creating a Generator reports the gap."""
    problems = graph_problems(spec, ios)
    if problems:
        raise ModelError(
            "\n".join(problems)
            if len(problems) == 1
            else f"{len(problems)} config/graph mismatches:\n  - " + "\n  - ".join(problems)
        )
    stages = []
    layout = None
    cross = None
    try:
        logits_stage = _logits_stage(spec, ios)
    except ModelError:
        if require_logits:
            raise
        logits_stage = None
    for step in spec.flow:
        session = spec.sessions[step.run]
        io = ios[step.run]
        # The self-attention cache belongs to the step phase; other phases feed it no state.
        stage_layout = detect_layout(io, spec.state.kv_cache, session)
        if step.when != "step":
            stage_layout = None
        if stage_layout is not None:
            if layout is not None and layout.past != stage_layout.past:
                raise ModelError(
                    f"{io.file}: its KV cache ({stage_layout.pattern}) differs from "
                    f"{layout.file}'s ({layout.pattern}); step stages must share one cache"
                )
            layout = stage_layout
        kv_names = set()
        if stage_layout is not None:  # the cache feeds its tensors and its driver inputs
            kv_names = {n for layer in stage_layout.past for n in layer}
            kv_names.update(name for _, name in stage_layout.drivers)
        cross_names: frozenset[str] = frozenset()
        source = step.cross_attention_from or (
            spec.state.cross_cache.source if spec.state.cross_cache else None
        )
        if step.when == "step" and source in ios and source != step.run:
            found = detect_cross(source, ios[source], spec.sessions[source], io, session)
            if found is not None:
                if cross is not None and cross.source != found.source:
                    raise ModelError(
                        f"{io.file}: cross-attends to {found.source!r}, another stage to "
                        f"{cross.source!r}; one cross cache per pipeline"
                    )
                cross = found
                cross_names = found.inputs
        feeds = []
        wired = {w.dst_tensor: w for w in spec.dataflow if w.dst == step.run}
        roles = {role_name(session, r): r for r in INPUT_ROLES}
        for name, info in io.inputs.items():
            if name in wired:
                feeds.append(Feed(name, "wire", info, wire=wired[name]))
            elif name in kv_names:
                feeds.append(Feed(name, "kv", info))
            elif name in cross_names:
                feeds.append(Feed(name, "cross", info))
            elif name in roles:
                feeds.append(Feed(name, "role", info, role=roles[name]))
            else:
                feeds.append(Feed(name, "user", info))
        logits = None
        # A prefill/decode split has one logits stage per kind of pass.
        split = step.when == "step" and not (step.run_on_prompt and step.run_on_token_gen)
        if step.run == logits_stage or (split and role_name(session, "logits") in io.outputs):
            logits = io.outputs[role_name(session, "logits")]
        outs = tuple(dict.fromkeys(w.src_tensor for w in spec.dataflow if w.src == step.run))
        stages.append(StagePlan(step, session, io, tuple(feeds), stage_layout, logits, outs))
    _check_kv_configured(spec, ios, layout)
    vocab = None
    for stage in stages:
        if stage.logits is not None:
            vocab = stage.logits.static_dim(stage.logits.rank - 1)
    return Plan(tuple(stages), layout, vocab or spec.model.vocab_size, cross)


def logits_problem(spec: PipelineSpec, ios: Mapping[str, SessionIO]) -> ModelError | None:
    """The error a pipeline without a logits output gets (None when it has one)."""
    try:
        _logits_stage(spec, ios)
    except ModelError as exc:
        return exc
    return None


def _logits_stage(spec: PipelineSpec, ios: Mapping[str, SessionIO]) -> str:
    """The last step stage that outputs the logits tensor."""
    found = None
    for step in spec.steps("step"):
        session = spec.sessions[step.run]
        if role_name(session, "logits") in ios[step.run].outputs:
            found = step.run
    if found is None:
        files = ", ".join(ios[s.run].file for s in spec.steps("step"))
        raise ModelError(f"no step stage outputs the logits tensor (checked: {files})")
    return found


def graph_problems(spec: PipelineSpec, ios: Mapping[str, SessionIO]) -> list[str]:
    """Every mismatch between the config and the loaded graphs (empty when they agree)."""
    return _wire_problems(spec, ios) + _role_problems(spec, ios)


def _wire_problems(spec: PipelineSpec, ios: Mapping[str, SessionIO]) -> list[str]:
    problems = []
    for i, wire in enumerate(spec.dataflow):
        src, dst = ios.get(wire.src), ios.get(wire.dst)
        if src is None or dst is None:
            continue  # session not loaded (e.g. used only by a strategy)
        where = f"pipeline.dataflow[{i}] ({wire})"
        if wire.src_tensor not in src.outputs:
            problems.append(
                f"{where}: {src.file} has no output {wire.src_tensor!r}; "
                f"outputs: {', '.join(src.outputs)}"
            )
        elif wire.dst_tensor not in dst.inputs:
            problems.append(
                f"{where}: {dst.file} has no input {wire.dst_tensor!r}; "
                f"inputs: {', '.join(dst.inputs)}"
            )
        elif src.outputs[wire.src_tensor].type != dst.inputs[wire.dst_tensor].type:
            a, b = src.outputs[wire.src_tensor], dst.inputs[wire.dst_tensor]
            problems.append(f"{where}: {src.file} gives {a.type}, {dst.file} expects {b.type}")
    return problems


def _role_problems(spec: PipelineSpec, ios: Mapping[str, SessionIO]) -> list[str]:
    """A tensor the config renames from its default must exist in the graph.

    Builder configs list default names whether or not the graph uses them (the reference feeds
    only inputs the graph declares), so only a changed name is a claim about the graph.
    """
    problems = []
    for name, session in spec.sessions.items():
        io = ios.get(name)
        if io is None:
            continue
        for side, roles, names in (
            ("inputs", session.inputs, io.inputs),
            ("outputs", session.outputs, io.outputs),
        ):
            for role, tensor in roles.items():
                if role in _PATTERN_ROLES or "%d" in tensor:
                    continue
                default = INPUT_ROLES.get(role) or OUTPUT_ROLES.get(role) or role
                if tensor != default and tensor not in names:
                    problems.append(
                        f"{io.file}: the config maps {side[:-1]} {role!r} to {tensor!r} "
                        f"(pipeline.sessions.{name}.{side}.{role}) but the graph has no such "
                        f"{side[:-1]}; graph {side}: {', '.join(names)}"
                    )
    return problems


def _check_kv_configured(spec: PipelineSpec, ios, layout: KVLayout | None) -> None:
    """No step stage has a KV cache: fine, unless the config renamed one the graph lacks
    (conventional names are builder boilerplate, listed even for stateless graphs)."""
    if layout is not None:
        return
    conventional = {patterns[0] for patterns in KNOWN_PATTERNS}
    for step in spec.steps("step"):
        pattern = configured_kv_pattern(spec.state.kv_cache, spec.sessions[step.run])
        io = ios[step.run]
        if pattern and "%d" in pattern and pattern not in conventional:
            first = pattern.replace("%d", "0")
            raise ModelError(
                f"{io.file}: the config names KV input {first!r} (pattern {pattern!r}) but the "
                f"graph has no such input; graph inputs: {', '.join(io.inputs)}"
            )
