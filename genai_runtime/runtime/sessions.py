"""onnxruntime sessions built from a SessionSpec: options, providers, requirements, clear errors."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable
from pathlib import Path

import onnxruntime as ort

from ..environment import gpu_device_id, plugin_devices
from ..errors import GenaiRuntimeError, ModelError, TrustError, UnsupportedError, first_line
from ..session.device import check_provider
from ..session.graph_io import SessionIO
from ..session.providers import CPU, RECORD_ASSIGNMENT, check_granted, preload_libraries
from ..spec import PipelineSpec, SessionOptionsSpec, SessionSpec
from . import prune

# genai_config provider names -> onnxruntime execution providers.
PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "rocm": "ROCMExecutionProvider",
    "dml": "DmlExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "qnn": "QNNExecutionProvider",
    "webgpu": "WebGpuExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "nvtensorrtrtx": "NvTensorRTRTXExecutionProvider",
    "vitisai": "VitisAIExecutionProvider",
}
_OPT_LEVELS = {
    "ORT_DISABLE_ALL": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "ORT_ENABLE_BASIC": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "ORT_ENABLE_EXTENDED": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "ORT_ENABLE_ALL": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
# onnxruntime's entry that parks a session's pool threads when a run returns (instead of
# letting them spin on, taking the cores the next session needs).
STOP_SPINNING = "session.force_spinning_stop"
_EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"

_EXEC_MODES = {
    "sequential": ort.ExecutionMode.ORT_SEQUENTIAL,
    "parallel": ort.ExecutionMode.ORT_PARALLEL,
}


def ort_provider(name: str) -> str:
    if name.endswith("ExecutionProvider"):
        return name
    key = name.lower().replace("_", "").replace("-", "")
    if key not in PROVIDERS:
        if plugin_devices(name):  # a registered plugin library's provider, by its own name
            return name
        raise UnsupportedError(
            f"unknown execution provider {name!r} (expected one of: {', '.join(PROVIDERS)})"
        )
    return PROVIDERS[key]


def session_options(
    spec: SessionOptionsSpec, model_dir: Path, trust: bool, where: str = "session_options"
) -> ort.SessionOptions:
    so = ort.SessionOptions()
    if spec.intra_op_num_threads is not None:
        so.intra_op_num_threads = spec.intra_op_num_threads
    if spec.inter_op_num_threads is not None:
        so.inter_op_num_threads = spec.inter_op_num_threads
    if spec.graph_optimization_level is not None:
        so.graph_optimization_level = _OPT_LEVELS[spec.graph_optimization_level]
    if spec.execution_mode is not None:
        so.execution_mode = _EXEC_MODES[spec.execution_mode]
    if spec.enable_cpu_mem_arena is not None:
        so.enable_cpu_mem_arena = spec.enable_cpu_mem_arena
    if spec.enable_mem_pattern is not None:
        so.enable_mem_pattern = spec.enable_mem_pattern
    if spec.enable_profiling:
        so.enable_profiling = True
        so.profile_file_prefix = spec.enable_profiling
    if spec.log_id:
        so.logid = spec.log_id
    so.log_severity_level = 3 if spec.log_severity_level is None else spec.log_severity_level
    if spec.log_verbosity_level is not None:
        so.log_verbosity_level = spec.log_verbosity_level
    for key, value in spec.config_entries.items():
        if key != prune.SETTING:  # ours, read by create_session; not an onnxruntime entry
            so.add_session_config_entry(key, value)
    if spec.custom_ops_library:
        key = f"{where}.custom_ops_library"
        if not trust:
            raise TrustError(
                f"{key} asks to load native code ({spec.custom_ops_library!r}); "
                "pass trust_remote_code=True to allow it"
            )
        library = model_dir / spec.custom_ops_library
        if not library.is_file():
            raise ModelError(f"{key}: library not found: {library}")
        try:
            so.register_custom_ops_library(str(library))
        except Exception as exc:  # onnxruntime's Fail for a library it cannot load
            raise ModelError(f"{key}: cannot load {library}: {exc}") from exc
    return so


# Provider options this runtime turns off, with why (a warning says it). None today: the CUDA
# provider's enable_cuda_graph is honoured (runtime/cuda_graphs.py).
DISABLED_OPTIONS: dict[str, str] = {}


def providers_for(spec: SessionOptionsSpec) -> list[tuple[str, dict[str, str]]]:
    """Providers in the config's order, CPU last; each must exist in this onnxruntime build.
    Options in ``DISABLED_OPTIONS`` are set off (a warning says so)."""
    chosen: list[tuple[str, dict[str, str]]] = []
    for provider in spec.providers:
        if not provider.name:
            continue
        name = ort_provider(provider.name)
        if not plugin_devices(name):  # a plugin library's provider is not in the build list
            check_provider(name, provider.name)
        options = dict(provider.options)
        for key, why in DISABLED_OPTIONS.items():
            if str(options.get(key, "0")).lower() not in ("0", "false", ""):
                warnings.warn(f"{name} {key}: {why}", RuntimeWarning, stacklevel=2)
                options[key] = "0"
        if name == "CUDAExecutionProvider" and gpu_device_id() is not None:
            options.setdefault("device_id", str(gpu_device_id()))  # set_current_gpu_device_id
        chosen.append((name, options))
    if all(name != "CPUExecutionProvider" for name, _ in chosen):
        chosen.append(("CPUExecutionProvider", {}))
    return chosen


def check_build_requires(spec: SessionOptionsSpec, where: str) -> None:
    req = spec.build_requires
    if req.onnxruntime and not version_satisfies(ort.__version__, req.onnxruntime):
        raise UnsupportedError(
            f"{where}: needs onnxruntime {req.onnxruntime}, this is onnxruntime {ort.__version__}"
        )
    available = ort.get_available_providers()
    for provider in req.providers:
        if ort_provider(provider) not in available:
            raise UnsupportedError(
                f"{where}: needs execution provider {provider!r}, not in this onnxruntime build "
                f"(available: {', '.join(available)})"
            )


def takes_turns(spec: PipelineSpec) -> bool:
    """Whether several sessions run on every token (a pipeline of step stages, or a draft model
    or proposer head beside the target).

    Each session has its own thread pool whose workers spin for a while after a run; the next
    session's run then competes with them for the cores. Such sessions get
    ``session.force_spinning_stop`` unless the config sets it (SmolLM2 int4 as a 3-session
    pipeline on 2 cores: 61 -> 87 tok/s; a single session: unchanged, 94 tok/s either way).
    """
    per_token = len({s.run for s in spec.flow if s.when == "step" and s.run_on_token_gen})
    strategy = spec.strategy
    proposer = strategy.kind == "speculative" and (strategy.producer or "draft_model") != "ngram"
    return per_token + proposer > 1


def create_session(
    spec: SessionSpec,
    path: Path,
    model_dir: Path,
    *,
    trust: bool = False,
    turns: bool = False,
    model_bytes: bytes | None = None,
) -> ort.InferenceSession:
    """Build one session; a missing or unreadable file raises ModelError naming the file.
    ``model_bytes``: the file's graph as rewritten in memory, run instead of the file (its
    weights still read beside it)."""
    where = f"pipeline.sessions.{spec.name}"
    check_build_requires(spec.options, where)
    if not path.is_file():
        raise ModelError(f"{where}.file: model file not found: {path}")
    options = session_options(spec.options, model_dir, trust, f"{where}.session_options")
    if turns and STOP_SPINNING not in spec.options.config_entries:
        options.add_session_config_entry(STOP_SPINNING, "1")
    try:
        providers = providers_for(spec.options)
    except UnsupportedError as exc:  # name the session, as the other load errors do
        raise UnsupportedError(f"{where}: {exc}") from exc
    if any(name != CPU for name, _ in providers) and (
        RECORD_ASSIGNMENT not in spec.options.config_entries
    ):
        # Which nodes each provider took: explain shows it (a provider may take none).
        options.add_session_config_entry(RECORD_ASSIGNMENT, "1")
    model: str | bytes = str(path)
    if model_bytes is None and prune.wanted(dict(spec.options.config_entries)):
        model_bytes = _pruned(spec, path)
    if model_bytes is not None:
        model = model_bytes
        # The bytes keep their external-data references; they resolve beside the file.
        options.add_session_config_entry(_EXTERNAL_DATA_FOLDER, str(path.parent))
    requested = list(providers)
    if any(name != CPU for name, _ in requested):
        preload_libraries()
    if any(plugin_devices(name) for name, _ in providers):
        add_providers_by_device(options, providers)
        providers = []
    try:
        session = ort.InferenceSession(
            model,
            sess_options=options,
            providers=[name for name, _ in providers] or None,
            provider_options=[opts for _, opts in providers] or None,
            # A provider that fails to start raises (its reason), not a retry on the CPU.
            enable_fallback=0,
        )
    except Exception as exc:  # onnxruntime raises several unrelated types for a bad file
        reason = first_line(exc)
        on = [f"{name} device_id {opts['device_id']}" for name, opts in providers
              if "device_id" in opts]  # fmt: skip
        at = f" on {', '.join(on)}" if on else ""
        raise ModelError(f"{where}.file: cannot load {path}{at}: {reason}") from exc
    # onnxruntime drops a requested provider that cannot start, and only logs it.
    check_granted(session, requested, where)
    return session


def add_providers_by_device(
    options: ort.SessionOptions, providers: list[tuple[str, dict[str, str]]]
) -> None:
    """Select providers by device, as a plugin library's provider must be (onnxruntime then
    takes no provider names, so every provider of the session goes this way, CPU included)."""
    devices = ort.get_ep_devices()
    for name, provider_options in providers:
        found = [d for d in devices if d.ep_name == name]
        if not found:
            offered = sorted({d.ep_name for d in devices})
            raise UnsupportedError(
                f"execution provider {name} offers no device to run on beside a plugin "
                f"provider (providers with devices: {', '.join(offered)})"
            )
        options.add_provider_for_devices(found, provider_options)


def _pruned(spec: SessionSpec, path: Path) -> bytes | None:
    logits = spec.outputs.get("logits", "logits")
    mask = spec.inputs.get("attention_mask", "attention_mask")
    try:
        return prune.pruned_model_bytes(path, logits, mask)
    except GenaiRuntimeError:
        raise
    except Exception as exc:  # onnx's parse errors; the plain load reports them better
        reason = first_line(exc)
        where = f"pipeline.sessions.{spec.name}.file"
        raise ModelError(f"{where}: cannot edit {path}: {reason}") from exc


def load_sessions(
    spec: PipelineSpec,
    names: Iterable[str],
    *,
    trust: bool = False,
    turns: bool | None = None,
) -> tuple[dict[str, ort.InferenceSession], dict[str, SessionIO], list[GenaiRuntimeError]]:
    """Create the named sessions (none is run) and read their I/O.

    Every session is attempted, so a caller can report all failures (``validate``) or the
    first (``Model``). ``turns``: the sessions take turns with others on every token (None:
    ``takes_turns(spec)``).
    """
    if turns is None:
        turns = takes_turns(spec)
    model_dir = spec.model_dir or Path(".")
    sessions: dict[str, ort.InferenceSession] = {}
    ios: dict[str, SessionIO] = {}
    errors: list[GenaiRuntimeError] = []
    for name in names:
        session_spec = spec.sessions[name]
        try:
            session = create_session(
                session_spec, model_dir / session_spec.file, model_dir, trust=trust,
                turns=turns,
            )  # fmt: skip
        except GenaiRuntimeError as exc:
            errors.append(exc)
            continue
        sessions[name] = session
        ios[name] = SessionIO.of(session, session_spec.file, str(model_dir / session_spec.file))
    return sessions, ios, errors


def run_options(entries: dict[str, str] | None) -> ort.RunOptions | None:
    """RunOptions for the entries, or None when there are none (cheaper per run)."""
    if not entries:
        return None
    ro = ort.RunOptions()
    for key, value in (entries or {}).items():
        ro.add_run_config_entry(key, value)
    return ro


def version_satisfies(version: str, specifier: str) -> bool:
    """A small PEP 440 subset: comma-separated clauses of ``>=, >, <=, <, ==, !=`` on x.y.z."""
    ops = {
        ">=": lambda a, b: a >= b,
        ">": lambda a, b: a > b,
        "<=": lambda a, b: a <= b,
        "<": lambda a, b: a < b,
        "==": lambda a, b: a == b,
        "!=": lambda a, b: a != b,
    }
    have = _version_tuple(version)
    for clause in specifier.split(","):
        m = re.fullmatch(r"\s*(>=|<=|==|!=|>|<)\s*([0-9][0-9.]*)\s*", clause)
        if not m:
            raise UnsupportedError(f"cannot read version requirement {specifier!r}")
        if not ops[m.group(1)](have, _version_tuple(m.group(2))):
            return False
    return True


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = [int(p) for p in re.findall(r"\d+", text)[:3]]
    return tuple(parts + [0] * (3 - len(parts)))
