"""The typed, frozen pipeline spec: the only form of a config the rest of the runtime reads.

Built once from a validated, translated, preset-resolved v2 document by ``config.build``.
Variants are made with ``dataclasses.replace``; nothing here is mutated after construction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

Phase = Literal["init", "step", "final"]
PHASES: tuple[Phase, ...] = ("init", "step", "final")

DEFAULT_MAX_STAGES = 10


def frozen_map(items: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """A read-only copy of a mapping (key order kept)."""
    return MappingProxyType(dict(items or {}))


@dataclass(frozen=True)
class ProviderSpec:
    """One execution provider, in priority order, with its string options."""

    name: str
    options: Mapping[str, str] = field(default_factory=frozen_map)


@dataclass(frozen=True)
class BuildRequires:
    """What a session needs from the installed onnxruntime; checked before the session is built."""

    onnxruntime: str | None = None  # a version specifier such as ">=1.20"
    providers: tuple[str, ...] = ()


@dataclass(frozen=True)
class SessionOptionsSpec:
    """onnxruntime session settings. Unknown scalar keys become session config entries."""

    intra_op_num_threads: int | None = None
    inter_op_num_threads: int | None = None
    graph_optimization_level: str | None = None
    execution_mode: str | None = None
    enable_cpu_mem_arena: bool | None = None
    enable_mem_pattern: bool | None = None
    enable_profiling: str | None = None
    log_id: str | None = None
    log_severity_level: int | None = None
    log_verbosity_level: int | None = None
    custom_ops_library: str | None = None
    providers: tuple[ProviderSpec, ...] = ()
    config_entries: Mapping[str, str] = field(default_factory=frozen_map)
    run_options: Mapping[str, str] = field(default_factory=frozen_map)
    build_requires: BuildRequires = field(default_factory=BuildRequires)


@dataclass(frozen=True)
class SessionSpec:
    """One ONNX session of the pipeline.

    ``inputs`` / ``outputs`` map a role (``input_ids``, ``past_key_names``, ...) to the graph's
    tensor name; a role absent here uses its conventional name, checked against the real graph.
    """

    name: str
    file: str
    options: SessionOptionsSpec = field(default_factory=SessionOptionsSpec)
    inputs: Mapping[str, str] = field(default_factory=frozen_map)
    outputs: Mapping[str, str] = field(default_factory=frozen_map)


@dataclass(frozen=True)
class FlowStep:
    """Run one session in one phase.

    ``init`` runs once per new input before decoding (encoders, vision towers), ``step`` runs on
    every forward pass of the decode loop (the prompt pass included), ``final`` once at the end.
    ``run_on_prompt`` / ``run_on_token_gen`` restrict a step stage to the prompt pass or to the
    one-token passes (prefill/decode splits).
    """

    run: str
    when: Phase = "step"
    loop: Literal["batched", "per_image"] | None = None
    cross_attention_from: str | None = None
    run_on_prompt: bool = True
    run_on_token_gen: bool = True


@dataclass(frozen=True)
class Wire:
    """Output ``src_tensor`` of session ``src`` feeds input ``dst_tensor`` of session ``dst``."""

    src: str
    src_tensor: str
    dst: str
    dst_tensor: str

    def __str__(self) -> str:
        return f"{self.src}.{self.src_tensor} -> {self.dst}.{self.dst_tensor}"


@dataclass(frozen=True)
class SlidingWindowSpec:
    window_size: int
    pad_value: int = 0
    alignment: Literal["left", "right"] = "right"
    slide_key_value_cache: bool = True
    slide_inputs: bool = True
    layers: tuple[int, ...] = ()  # layers that use the window; empty: all of them
    cache_slack: int = 0  # rows a windowed cache keeps beyond the window; 0: the default (16)


@dataclass(frozen=True)
class KVCacheSpec:
    """How the decoder's self-attention cache is laid out and managed.

    ``kind`` is a key of ``kv.CACHE_KINDS`` or ``"auto"`` (detected from the graph's I/O).
    Patterns use ``%d`` for the layer index; ``None`` means detect from the graph.
    Dimensions left ``None`` are read from the graph where it states them.
    """

    kind: str = "auto"
    format: Literal["separate", "combined"] | None = None
    past_key_pattern: str | None = None
    past_value_pattern: str | None = None
    present_key_pattern: str | None = None
    present_value_pattern: str | None = None
    num_layers: int | None = None
    num_kv_heads: int | None = None
    head_size: int | None = None
    sliding_window: SlidingWindowSpec | None = None
    # static-scatter driver inputs (int64 [batch]); None: the conventional names
    write_indices: str | None = None
    nonpad_kv_seqlen: str | None = None
    num_kv_blocks: int | None = None  # graph-scattered caches read in this many blocks


@dataclass(frozen=True)
class CrossCacheSpec:
    source: str
    frozen: bool = True


@dataclass(frozen=True)
class PositionSpec:
    strategy: Literal["default", "mrope_3d", "none"] = "default"
    grid_source: str | None = None


@dataclass(frozen=True)
class StateSpec:
    kv_cache: KVCacheSpec = field(default_factory=KVCacheSpec)
    cross_cache: CrossCacheSpec | None = None
    position_ids: PositionSpec = field(default_factory=PositionSpec)


@dataclass(frozen=True)
class TokensSpec:
    bos: int | None = None
    eos: tuple[int, ...] = ()
    pad: int | None = None
    decoder_start: int | None = None
    extra: Mapping[str, int] = field(default_factory=frozen_map)


@dataclass(frozen=True)
class ProcessorSpec:
    """One entry of ``generation.logits``: a registered processor kind and its parameters."""

    kind: str
    params: Mapping[str, Any] = field(default_factory=frozen_map)


def _option(
    default: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    chain: bool = False,
    flag: str | None = None,
    help: str | None = None,
) -> Any:
    """A search option, declared once: ``GeneratorParams.set_search_options`` takes its type and
    range from here, the decoding chain its ``chain`` mark (the reference order turns it into a
    link, so a v2 ``generation.logits`` list replaces it) and ``run`` / ``chat`` its ``flag``."""
    meta = {"search": True, "low": low, "high": high, "chain": chain, "flag": flag, "help": help}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class GenerationSpec:
    """Search options, with onnxruntime-genai's names and defaults."""

    # 0 until resolved against the model's context length
    max_length: int = _option(0, low=1)
    min_length: int = _option(0, low=0, chain=True, flag="--min-length",
                              help="minimum total length")  # fmt: skip
    batch_size: int = _option(1, low=1)
    num_beams: int = _option(1, low=1)
    num_return_sequences: int = _option(1, low=1)
    do_sample: bool = _option(False, flag="--do-sample", help="sample (not greedy)")
    top_k: int = _option(50, low=0, chain=True, flag="--top-k")
    top_p: float = _option(1.0, low=0.0, high=1.0, chain=True, flag="--top-p")
    temperature: float = _option(1.0, low=0.0, chain=True, flag="--temperature")
    min_p: float = _option(0.0, low=0.0, high=1.0, chain=True)
    repetition_penalty: float = _option(1.0, chain=True, flag="--repetition-penalty")
    no_repeat_ngram_size: int = _option(0, low=0, chain=True, flag="--no-repeat-ngram-size")
    length_penalty: float = _option(1.0)
    diversity_penalty: float = _option(0.0)
    early_stopping: bool = _option(True)
    past_present_share_buffer: bool = _option(False)
    random_seed: int = _option(-1, flag="--seed", help="random seed for sampling")
    chunk_size: int = _option(0, low=0)
    logits: tuple[ProcessorSpec, ...] = ()
    stop: tuple[str, ...] = ()

    @classmethod
    def from_openai(cls, temperature: float, top_p: float, top_k: int) -> GenerationSpec:
        """Search options for OpenAI-style settings (the server's requests, the batch runner's
        rows): temperature 0 or top_k 1 is greedy, top_k 0 keeps the whole vocabulary."""
        greedy = temperature == 0.0 or top_k == 1
        return cls(do_sample=not greedy, top_k=top_k, top_p=top_p, temperature=temperature)

    @property
    def is_greedy(self) -> bool:
        """onnxruntime-genai's rule: greedy unless sampling is on with a real choice to make."""
        return not self.do_sample or self.top_k == 1 or self.temperature == 0.0


@dataclass(frozen=True)
class StrategySpec:
    """How tokens are produced: one per step, or drafted and verified (speculative)."""

    kind: Literal["standard", "speculative"] = "standard"
    producer: str | None = None  # speculative proposer kind: draft_model | ngram | eagle
    draft_session: str | None = None
    verify_session: str | None = None
    num_speculative_tokens: int = 4
    acceptance: str = "auto"  # auto: greedy match when decoding is greedy, else rejection sampling
    params: Mapping[str, Any] = field(default_factory=frozen_map)


@dataclass(frozen=True)
class PluginSpec:
    """Code a config asks to load; never loaded without the caller's explicit trust flag."""

    library: str | None = None
    entry_point: str | None = None
    module: str | None = None
    params: Mapping[str, Any] = field(default_factory=frozen_map)


@dataclass(frozen=True)
class ModelInfo:
    """Descriptive model facts from the config. ``type`` is shown to people, never routed on."""

    type: str | None = None
    vocab_size: int | None = None
    context_length: int | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None


@dataclass(frozen=True)
class PipelineSpec:
    sessions: Mapping[str, SessionSpec]
    flow: tuple[FlowStep, ...]
    dataflow: tuple[Wire, ...] = ()
    state: StateSpec = field(default_factory=StateSpec)
    roles: Mapping[str, str] = field(default_factory=frozen_map)
    strategy: StrategySpec = field(default_factory=StrategySpec)
    controller: PluginSpec | None = None
    plugin: PluginSpec | None = None
    tokens: TokensSpec = field(default_factory=TokensSpec)
    generation: GenerationSpec = field(default_factory=GenerationSpec)
    model: ModelInfo = field(default_factory=ModelInfo)
    metadata: Mapping[str, Any] = field(default_factory=frozen_map)
    max_stages: int = DEFAULT_MAX_STAGES
    source_version: int = 2
    extends: tuple[str, ...] = ()  # preset chain, nearest first
    model_dir: Path | None = None
    root: Path | None = None  # where the folder's files may resolve (None: the folder itself)

    def steps(self, phase: Phase) -> tuple[FlowStep, ...]:
        return tuple(s for s in self.flow if s.when == phase)


@dataclass(frozen=True)
class SearchOption:
    """One search option as ``GenerationSpec`` declares it."""

    name: str
    kind: type  # int, float or bool
    default: Any
    low: float | None
    high: float | None
    chain: bool
    flag: str | None
    help: str | None


_KINDS = {"int": int, "float": float, "bool": bool}


def search_options() -> dict[str, SearchOption]:
    """Every search option, by onnxruntime-genai's name, in declaration order."""
    out = {}
    for f in fields(GenerationSpec):
        if f.metadata.get("search"):
            meta = f.metadata
            out[f.name] = SearchOption(
                f.name, _KINDS[f.type], f.default, meta["low"], meta["high"], meta["chain"],
                meta["flag"], meta["help"],
            )  # fmt: skip
    return out


SEARCH_OPTIONS: dict[str, SearchOption] = search_options()
