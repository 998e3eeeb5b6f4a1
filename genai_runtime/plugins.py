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
from .errors import ConfigError, ConfigProblem, GenerationError, TrustError
from .runtime.driver import DecodeState, DriverSetup, forward_rows
from .spec import PluginSpec

if TYPE_CHECKING:
    from .runtime.executor import Executor

ENTRY_POINT_GROUP = "genai_runtime.controllers"
_WHERE = "pipeline.controller"


@dataclass(frozen=True)
class Controller:
    name: str  # what the config asked for, for messages and explain
    step: Callable[[StepContext], None]

    def make_driver(self, setup: DriverSetup) -> ControllerDriver:
        """The driver a new generator decodes with (``Model.driver_factory``)."""
        return ControllerDriver(self, setup)


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
        raise ConfigError.at(_WHERE, "expected module (+ factory) or entry_point")
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
        raise ConfigError.at(f"{_WHERE}.module", f"file not found: {path}")
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

    def __init__(self, driver: ControllerDriver, state: DecodeState):
        self._driver = driver
        self._state = state
        self._exec: Executor = state.executor
        self._head = state.logits  # next-token logits the generator already holds
        self.appended: list[int] = []

    @property
    def tokens(self) -> np.ndarray:
        """The committed sequence (prompt, earlier output and this call's appends)."""
        return self._state.tokens[: self.length].copy()

    @property
    def length(self) -> int:
        return self._state.length + len(self.appended)

    @property
    def processed(self) -> int:
        """How many tokens the target's cache holds."""
        return self._exec.length

    @property
    def vocab_size(self) -> int:
        return self._driver.vocab_size

    @property
    def params(self) -> Mapping[str, Any]:
        eos = tuple(sorted(self._state.stop.eos))
        return {"max_length": self._state.max_length, "eos": eos}

    def append(self, tokens: Any) -> None:
        new = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if new.size and (new.min() < 0 or new.max() >= self.vocab_size):
            raise GenerationError(f"controller appended a token outside [0, {self.vocab_size})")
        if self.length + new.size > self._state.max_length:
            raise GenerationError(
                f"controller appended {new.size} tokens past max_length {self._state.max_length}"
            )
        self._state.tokens[self.length : self.length + new.size] = new
        self.appended.extend(int(t) for t in new)

    def forward(self, tokens: Any) -> np.ndarray:
        """Run ``tokens`` after the ``processed`` ones; their next-token logits ``[n, V]``."""
        ids = np.asarray(tokens, dtype=np.int32).reshape(-1)
        if ids.size == 0:
            raise GenerationError("controller forward() needs at least one token")
        self._driver.fed[self.processed : self.processed + ids.size] = ids
        self._head = None
        return forward_rows(self._exec, ids).copy()

    def logits(self) -> np.ndarray:
        """Next-token logits ``[V]`` after the committed sequence (runs what has not run)."""
        ran = self.processed
        if self._head is not None and ran == self.length:
            return self._head.reshape(-1).copy()
        if ran >= self.length:
            self.rewind_to(self.length - 1)
            ran = self.processed
        return self.forward(self._state.tokens[ran : self.length])[-1]

    def output(self, name: str) -> np.ndarray:
        """An output of the last forward pass, e.g. ``hidden_states``."""
        return self._exec.output(name)

    def rewind_to(self, length: int) -> None:
        if not 0 <= length <= self.processed:
            raise GenerationError(f"cannot rewind to {length}: {self.processed} tokens have run")
        self._exec.rewind_to(length)
        self._head = None

    def is_done(self) -> bool:
        stop = self._state.stop
        if any(stop.check(t, generated=0, length=0) for t in self.appended):
            return True  # an EOS: the controller's sequence has ended
        return stop.fills(self.length, self._state.max_length)


class ControllerDriver:
    """Runs the controller once per round; keeps only the run tokens that match what it
    appended, so the target's cache and the committed sequence agree afterwards."""

    def __init__(self, controller: Controller, setup: DriverSetup):
        self.controller = controller
        self.vocab_size = setup.vocab_size
        self.fed = np.zeros(setup.max_length, np.int32)  # the tokens the cache holds

    def round(self, state: DecodeState) -> list[int]:
        ex = state.executor
        ran = ex.length
        self.fed[:ran] = state.tokens[:ran]
        ctx = StepContext(self, state)
        self.controller.step(ctx)
        if not ctx.appended:
            raise GenerationError(f"controller {self.controller.name} appended no token")
        # Keep only the run tokens that match the committed sequence.
        held = min(ex.length, ctx.length)
        differ = np.flatnonzero(self.fed[:held] != state.tokens[:held])
        ex.rewind_to(int(differ[0]) if differ.size else held)
        return ctx.appended

    def on_rewind(self, length: int) -> None:
        """Stateless between rounds: ``fed`` is refreshed from the sequence each round."""

    def stats(self) -> None:
        return None
