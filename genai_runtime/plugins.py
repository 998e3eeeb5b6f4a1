"""Controller plugins: Python code from a config that drives the decode loop (explicit trust only).

``pipeline.controller`` names a module (a dotted name, or a ``.py`` file inside the model
folder) and a ``factory``, or an ``entry_point`` in the ``genai_runtime.controllers`` group.
``factory(params)`` returns a callable ``step(ctx: StepContext) -> None`` that is called
whenever the generator needs tokens; each call appends at least one token through ``ctx``.
Nothing is imported unless the caller passed ``trust_remote_code=True``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .config.paths import resolve_inside
from .config.spec import PluginSpec
from .decoding.speculative import BufferedDriver
from .errors import ConfigError, ConfigProblem, GenerationError, TrustError

if TYPE_CHECKING:
    from .generator import Generator

ENTRY_POINT_GROUP = "genai_runtime.controllers"
_WHERE = "pipeline.controller"


@dataclass(frozen=True)
class Controller:
    name: str  # what the config asked for, for messages and explain
    step: Callable[[StepContext], None]


def describe(spec: PluginSpec) -> str:
    if spec.entry_point:
        return f"entry point {spec.entry_point!r}"
    factory = spec.params.get("factory", "make")
    return f"{spec.module}:{factory}"


def load_controller(
    spec: PluginSpec | None, *, trust: bool, model_dir: Path, root: Path | None = None
) -> Controller | None:
    """Import and build the controller a config asks for; TrustError without the trust flag."""
    if spec is None:
        return None
    name = describe(spec)
    if not trust:
        raise TrustError(
            f"{_WHERE} asks to run Python code ({name}); pass trust_remote_code=True "
            "(CLI: --trust-remote-code) to allow it"
        )
    params = {k: v for k, v in spec.params.items() if k != "factory"}
    if spec.entry_point:
        found = [e for e in metadata.entry_points(group=ENTRY_POINT_GROUP)
                 if e.name == spec.entry_point]  # fmt: skip
        if not found:
            raise ConfigError(
                [ConfigProblem(f"{_WHERE}.entry_point",
                               f"no {ENTRY_POINT_GROUP!r} entry point named {spec.entry_point!r}")]
            )  # fmt: skip
        factory = found[0].load()
    elif spec.module:
        module = _import(spec.module, model_dir, root)
        factory = getattr(module, spec.params.get("factory", "make"), None)
        if not callable(factory):
            raise ConfigError(
                [ConfigProblem(f"{_WHERE}.factory", f"{name} is not a callable in the module")]
            )
    else:
        raise ConfigError([ConfigProblem(_WHERE, "expected module (+ factory) or entry_point")])
    step = factory(params)
    if not callable(step):
        raise ConfigError(
            [ConfigProblem(_WHERE, f"{name} returned {type(step).__name__}, not a callable step")]
        )
    return Controller(name, step)


def _import(module: str, model_dir: Path, root: Path | None):
    if not module.endswith(".py"):
        return importlib.import_module(module)
    path = resolve_inside(model_dir, module, root, f"{_WHERE}.module")
    if not path.is_file():
        raise ConfigError([ConfigProblem(f"{_WHERE}.module", f"file not found: {path}")])
    name = f"genai_runtime_controller_{abs(hash(str(path)))}"
    loader = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(loader)
    sys.modules[name] = mod
    loader.loader.exec_module(mod)
    return mod


class StepContext:
    """What a controller sees during one call: the sequence, the target model and its cache.

    ``append`` commits tokens (handed to the user one at a time); ``forward`` runs tokens after
    everything already run and returns their logits; ``rewind_to`` drops run tokens past a
    length. Tokens run but not appended are dropped from the cache after the call.
    """

    def __init__(self, driver: ControllerDriver):
        self._driver = driver
        self._gen = driver.gen
        self._base = self._gen._length
        self._head = self._gen._logits  # next-token logits the generator already holds
        self.appended: list[int] = []

    @property
    def tokens(self) -> np.ndarray:
        """The committed sequence (prompt, earlier output and this call's appends)."""
        return self._gen._seq[0, : self.length].copy()

    @property
    def length(self) -> int:
        return self._base + len(self.appended)

    @property
    def processed(self) -> int:
        """How many tokens the target's cache holds."""
        return self._driver.exec.length

    @property
    def vocab_size(self) -> int:
        return self._gen.vocab_size

    @property
    def params(self) -> Mapping[str, Any]:
        return {"max_length": self._gen.max_length, "eos": tuple(self._gen.eos_token_ids)}

    def append(self, tokens: Any) -> None:
        new = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if new.size and (new.min() < 0 or new.max() >= self.vocab_size):
            raise GenerationError(f"controller appended a token outside [0, {self.vocab_size})")
        if self.length + new.size > self._gen.max_length:
            raise GenerationError(
                f"controller appended {new.size} tokens past max_length {self._gen.max_length}"
            )
        self._gen._seq[0, self.length : self.length + new.size] = new
        self.appended.extend(int(t) for t in new)

    def forward(self, tokens: Any) -> np.ndarray:
        """Run ``tokens`` after the ``processed`` ones; their next-token logits ``[n, V]``."""
        ids = np.asarray(tokens, dtype=np.int32).reshape(-1)
        if ids.size == 0:
            raise GenerationError("controller forward() needs at least one token")
        self._driver.fed[self.processed : self.processed + ids.size] = ids
        self._head = None
        return self._driver.forward(ids).copy()

    def logits(self) -> np.ndarray:
        """Next-token logits ``[V]`` after the committed sequence (runs what has not run)."""
        ran = self.processed
        if self._head is not None and ran == self.length:
            return self._head.reshape(-1).copy()
        if ran >= self.length:
            self.rewind_to(self.length - 1)
            ran = self.processed
        return self.forward(self._gen._seq[0, ran : self.length])[-1]

    def output(self, name: str) -> np.ndarray:
        """An output of the last forward pass, e.g. ``hidden_states``."""
        return self._driver.exec.output(name)

    def rewind_to(self, length: int) -> None:
        if not 0 <= length <= self.processed:
            raise GenerationError(f"cannot rewind to {length}: {self.processed} tokens have run")
        self._driver.exec.rewind_to(length)
        self._head = None

    def is_done(self) -> bool:
        gen = self._gen
        if any(gen._is_eos[t] for t in self.appended):
            return True
        return self.length >= gen.max_length


class ControllerDriver(BufferedDriver):
    def __init__(self, gen: Generator, controller: Controller):
        super().__init__(gen)
        self.controller = controller
        self.fed = np.zeros(gen.max_length, np.int32)

    def round(self) -> list[int]:
        gen = self.gen
        ran = self.exec.length
        self.fed[:ran] = gen._seq[0, :ran]
        ctx = StepContext(self)
        self.controller.step(ctx)
        if not ctx.appended:
            raise GenerationError(f"controller {self.controller.name} appended no token")
        # Keep only the run tokens that match the committed sequence.
        held = min(self.exec.length, ctx.length)
        differ = np.flatnonzero(self.fed[:held] != gen._seq[0, :held])
        self.exec.rewind_to(int(differ[0]) if differ.size else held)
        gen._logits = None
        return ctx.appended
