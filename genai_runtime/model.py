"""``Config`` and ``Model``: onnxruntime-genai's entry points over our spec, plan and sessions."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import onnxruntime as ort

from .config import load
from .config.loader import deep_merge, parse_json_text
from .errors import ConfigError, TrustError, UnsupportedError
from .folder_hashes import verify_folder
from .plugins import load_controller
from .routing import Route, classify
from .runtime.driver import DriverFactory
from .runtime.pipeline import LoadedPipeline
from .runtime.plan import Plan
from .session.device import parse_device
from .session.graph_io import SessionIO
from .spec import PipelineSpec, ProviderSpec, frozen_map
from .speculative import load_speculative
from .validation import shown

PathLike = str | os.PathLike

# onnxruntime execution provider -> onnxruntime-genai's Model.device_type.
DEVICE_TYPES = {
    "CPUExecutionProvider": "CPU",
    "CUDAExecutionProvider": "CUDA",
    "DmlExecutionProvider": "DML",
    "WebGpuExecutionProvider": "WebGPU",
    "QNNExecutionProvider": "QNN",
    "OpenVINOExecutionProvider": "OpenVINO",
    "ROCMExecutionProvider": "ROCm",
}


class Config:
    """A model folder's configuration, loaded and validated at construction.

    ``overlay(json)`` merges JSON over the file (and re-validates); provider calls override the
    execution providers of every session, as onnxruntime-genai's do for its decoder.
    """

    def __init__(
        self,
        path: PathLike,
        *,
        preset_dirs: Sequence[PathLike] = (),
        root: PathLike | None = None,
    ):
        if not isinstance(path, str | os.PathLike):
            raise ConfigError([f"Config(path): expected a folder or file path, got {shown(path)}"])
        self.path = Path(path)
        self._preset_dirs = tuple(Path(p) for p in preset_dirs)
        self.root = Path(root) if root is not None else None
        self._overlays: list[dict[str, Any]] = []
        self._providers: list[ProviderSpec] | None = None
        self._threads: int | None = None
        self._entries: dict[str, str] = {}
        self._spec = self._load()

    def _load(self) -> PipelineSpec:
        overlay: dict[str, Any] = {}
        for layer in self._overlays:
            overlay = deep_merge(overlay, layer)
        return load(self.path, overlay or None, preset_dirs=self._preset_dirs, root=self.root)

    @property
    def spec(self) -> PipelineSpec:
        if self._providers is None and self._threads is None and not self._entries:
            return self._spec
        changes: dict[str, Any] = {}
        if self._providers is not None:
            changes["providers"] = tuple(self._providers)
        if self._threads is not None:
            changes["intra_op_num_threads"] = self._threads

        def options(s: Any) -> Any:
            entries = {**s.options.config_entries, **self._entries}
            return dataclasses.replace(s.options, config_entries=frozen_map(entries), **changes)

        sessions = {
            name: dataclasses.replace(s, options=options(s))
            for name, s in self._spec.sessions.items()
        }
        return dataclasses.replace(self._spec, sessions=frozen_map(sessions))

    def set_threads(self, threads: int) -> None:
        """Run every session's operators on ``threads`` onnxruntime threads (each session's
        ``intra_op_num_threads``, over what the config says; ``--threads`` on the CLI)."""
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 256:
            raise ConfigError(
                [f"set_threads: expected an integer between 1 and 256, got {shown(threads)}"]
            )
        self._threads = threads

    def set_session_config_entry(self, key: str, value: str) -> None:
        """An onnxruntime session config entry for every session, over what the config says
        (a server that speculates stops each session's threads spinning after a run, as its
        verify session takes turns with the decoder)."""
        if not isinstance(key, str) or not isinstance(value, str) or not key:
            raise ConfigError([f"set_session_config_entry: expected two strings, got {shown(key)}"])
        self._entries[key] = value

    def overlay(self, json_text: str) -> None:
        if not isinstance(json_text, str):
            raise ConfigError([f"overlay: expected a JSON string, got {type(json_text).__name__}"])
        if not json_text.strip():
            return  # an empty overlay is no overlay, as in onnxruntime-genai
        layer = parse_json_text(json_text, "config overlay")
        if not isinstance(layer, dict):
            raise ConfigError(["overlay: expected a JSON object at the top level"])
        self._overlays.append(layer)
        try:
            self._spec = self._load()
        except Exception:
            self._overlays.pop()
            raise

    def clear_providers(self) -> None:
        self._providers = []

    def append_provider(self, provider: str) -> None:
        self._providers = [*(self._providers or []), ProviderSpec(provider)]

    def use_device(self, device: str) -> None:
        """Run every session on ``device`` (``cpu``, ``cuda``, ``cuda:1``, ``dml``, ...): the
        providers replaced by that one, ``:N`` its ``device_id`` (``--device`` on the CLI)."""
        name, options = parse_device(device)
        self.clear_providers()
        self.append_provider(name)
        for key, value in options.items():
            self.set_provider_option(name, key, value)

    def set_provider_option(self, provider: str, key: str, value: str) -> None:
        providers = list(self._providers or [])
        for i, p in enumerate(providers):
            if p.name == provider:
                providers[i] = ProviderSpec(provider, frozen_map({**p.options, key: value}))
                break
        else:
            providers.append(ProviderSpec(provider, frozen_map({key: value})))
        self._providers = providers


class Model:
    """Sessions for every stage of a pipeline, their I/O and the execution plan, built once."""

    def __init__(
        self,
        config: Config | PathLike,
        *,
        trust_remote_code: bool = False,
        root: PathLike | None = None,
        turns: bool = False,
        verify: bool = False,
    ):
        """``turns``: another model's sessions run between this one's on every token (a
        speculative target beside its draft): thread pools then park after each run.
        ``verify``: hash every file an import recorded and refuse the folder if one changed."""
        if not isinstance(config, Config | str | os.PathLike):
            raise ConfigError([f"Model(config): expected a Config or a path, got {shown(config)}"])
        if not isinstance(config, Config):
            config = Config(config, root=root)
        self.config = config
        spec = config.spec
        self.spec: PipelineSpec = spec
        self.route: Route = classify(spec)
        self.model_dir: Path = spec.model_dir or config.path
        if verify:
            verify_folder(self.model_dir, full=True)
        if spec.plugin is not None and not trust_remote_code:
            where = spec.plugin.library or spec.plugin.module
            raise TrustError(
                f"pipeline.plugin asks to load code ({where!r}); pass trust_remote_code=True "
                "to allow it"
            )
        if spec.plugin is not None:
            raise UnsupportedError("pipeline.plugin is not supported yet")
        self.controller = controller = load_controller(
            spec.controller, trust=trust_remote_code, model_dir=self.model_dir,
            root=config.root,
        )  # fmt: skip
        self.pipeline = LoadedPipeline.load(
            spec, trust=trust_remote_code, turns=turns or None, source=str(config.path)
        )
        self.sessions: dict[str, ort.InferenceSession] = dict(self.pipeline.sessions)
        self.ios: dict[str, SessionIO] = dict(self.pipeline.ios)
        # Loads without logits (hidden-states-only exports); Generator reports that gap.
        self.plan: Plan = self.pipeline.plan
        # Sessions that run by turns on every token park their threads after each run.
        self.takes_turns: bool = self.pipeline.takes_turns
        self.speculative = load_speculative(self.pipeline, trust=trust_remote_code)
        # How a generator gets tokens in rounds instead of one step at a time (None: plain).
        self.driver_factory: DriverFactory | None = None
        self.driver_kind = "plain decoding"
        if controller is not None:
            self.driver_factory, self.driver_kind = controller.make_driver, controller.name
        elif self.speculative is not None:
            self.driver_factory = self.speculative.make_driver
            self.driver_kind = "speculative decoding"

    @property
    def type(self) -> str:
        """The config's model type string (informational; never used for routing)."""
        return self.spec.model.type or self.route.kind

    @property
    def device_type(self) -> str:
        """The reference's name for the device the first session runs on ("CPU", "CUDA", ...)."""
        first = next(iter(self.sessions.values()), None)
        provider = first.get_providers()[0] if first is not None else "CPUExecutionProvider"
        return DEVICE_TYPES.get(provider, provider.removesuffix("ExecutionProvider"))

    @property
    def tokens(self):
        return self.spec.tokens

    @property
    def vocab_size(self) -> int | None:
        return self.plan.vocab_size

    def create_multimodal_processor(self):
        """The reference's processor: prompt + audio -> ``NamedTensors`` for ``set_inputs``."""
        from .multimodal import MultiModalProcessor

        return MultiModalProcessor(self)

    def create_streaming_processor(self):
        """The reference's streaming audio processor (raises: see ``StreamingProcessor``)."""
        from .multimodal import StreamingProcessor

        return StreamingProcessor(self)

    def transcribe(
        self,
        audio: PathLike | Sequence[PathLike],
        *,
        prompt: str | None = None,
        **search_options: Any,
    ) -> str | list[str]:
        """Greedy transcript of one audio file (a str) or several (a list). Clips of at most
        30 s decode as the reference decodes them (one batch); longer ones window by window
        with Whisper's timestamps (``audio.longform``)."""
        from .audio.longform import transcribe_clips
        from .multimodal.processor import TRANSCRIBE_PROMPT

        paths = [audio] if isinstance(audio, (str, os.PathLike)) else list(audio)
        clips = [(str(p), p) for p in paths]
        processor = self.create_multimodal_processor()
        prompt = TRANSCRIBE_PROMPT if prompt is None else prompt
        found = transcribe_clips(processor, self.new_generator, clips, prompt, **search_options)
        texts = [t.text for t in found]
        return texts[0] if isinstance(audio, (str, os.PathLike)) else texts

    def new_generator(self, **search_options: Any):
        """A fresh ``Generator`` with these search options (a convenience for drivers that
        run one generator after another, such as long-form transcription)."""
        from .generator import Generator, GeneratorParams

        params = GeneratorParams(self)
        params.set_search_options(**search_options)
        return Generator(self, params)

    def generate(self, prompt: str | list | dict, **search_options: Any) -> Iterator[str]:
        """Stream the text generated for a prompt string or chat messages."""
        from .generator import Generator, GeneratorParams
        from .tokenizer import Tokenizer

        tokenizer = Tokenizer(self)
        if isinstance(prompt, str):
            ids = tokenizer.encode_prompt(prompt)
        else:
            messages = [prompt] if isinstance(prompt, dict) else list(prompt)
            ids = tokenizer.encode_chat(messages)
        params = GeneratorParams(self)
        if search_options:
            params.set_search_options(**search_options)
        if params.search.num_beams > 1:
            raise UnsupportedError(
                "generate() streams one sequence; for beam search use a Generator and get_sequence"
            )
        generator = Generator(self, params)
        generator.append_tokens(ids)
        stream = tokenizer.create_stream()
        for token in generator:
            yield stream.decode(int(token))
