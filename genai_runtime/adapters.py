"""``Adapters``: the reference's container of LoRA adapters loaded for one model.

``load(path, name)`` reads an ``.onnx_adapter`` file and checks every tensor against the model's
graphs at once (the reference finds a mismatch only when a generator runs); a generator turns
adapters on with ``Generator.set_active_adapter(adapters, name)``. An adapter in use by a live
generator cannot be unloaded, as in the reference.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

from .errors import GenerationError
from .runtime.adapters import AdapterFile, Target, adapter_targets, check_adapter, read_adapter
from .runtime.pipeline import LoadedPipeline
from .validation import shown


class Adapters:
    def __init__(self, model: Any):
        # Any object with a loaded pipeline (an og.Model); Model is not imported, as Model and
        # Generator import each other and the generator imports this module.
        if not isinstance(getattr(model, "pipeline", None), LoadedPipeline):
            raise GenerationError(f"Adapters(model): expected a Model, got {shown(model)}")
        self.model = model
        self._files: dict[str, AdapterFile] = {}
        self._users: dict[str, weakref.WeakSet] = {}  # generators that activated each one
        self._targets: dict[str, list[Target]] | None = None
        self._lock = threading.Lock()

    def load(self, adapter_file_path: str | os.PathLike, adapter_name: str) -> None:
        name = _name(adapter_name)
        adapter = read_adapter(adapter_file_path)
        check_adapter(adapter, self._model_targets())
        with self._lock:
            if name in self._files:
                raise GenerationError(f"adapter {name!r} is already loaded")
            self._files[name] = adapter
            self._users[name] = weakref.WeakSet()

    def unload(self, adapter_name: str) -> None:
        name = _name(adapter_name)
        with self._lock:
            self._known(name)
            if len(self._users[name]):
                raise GenerationError(
                    f"adapter {name!r} is still in use by {len(self._users[name])} generator(s)"
                )
            del self._files[name], self._users[name]

    # -- not in the reference ----------------------------------------------------------------

    def names(self) -> list[str]:
        with self._lock:
            return list(self._files)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._files

    def acquire(self, adapter_name: str, user: Any) -> AdapterFile:
        """The adapter's file, now held by ``user`` (a generator) until ``user`` is freed."""
        name = _name(adapter_name)
        with self._lock:
            self._known(name)
            self._users[name].add(user)
            return self._files[name]

    def release(self, adapter_name: str, user: Any) -> None:
        """``user`` no longer holds the adapter (its activation failed)."""
        with self._lock:
            users = self._users.get(adapter_name)
            if users is not None:
                users.discard(user)

    def _known(self, name: str) -> None:
        if name not in self._files:
            loaded = ", ".join(repr(n) for n in self._files) or "none"
            raise GenerationError(f"adapter {name!r} is not loaded (loaded: {loaded})")

    def _model_targets(self) -> dict[str, list[Target]]:
        if self._targets is None:
            pipeline = self.model.pipeline
            pairs = [(stage, pipeline.sessions[stage.name]) for stage in pipeline.plan.stages]
            self._targets = adapter_targets(pairs)
        return self._targets


def _name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise GenerationError(f"adapter name: expected a non-empty string, got {shown(name)}")
    return name
