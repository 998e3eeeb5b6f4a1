"""Load a model folder with a fixed number of onnxruntime threads, and start an engine over it.

A replica or a batch actor is given a share of a machine's cores (Ray's ``num_cpus``); its
sessions must use that many threads, not onnxruntime's default of one per physical core, or
several replicas on one machine fight over the same cores.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import GenaiRuntimeError
from ..model import Config, Model
from ..validation import shown


def threads_overlay(config: Config, threads: int) -> str:
    """A config overlay setting ``intra_op_num_threads`` (v1: the decoder's session options;
    v2: every session's)."""
    options = {"session_options": {"intra_op_num_threads": threads}}
    if config.spec.source_version == 1:
        return json.dumps({"model": {"decoder": options}})
    sessions = dict.fromkeys(config.spec.sessions, options)
    return json.dumps({"pipeline": {"sessions": sessions}})


def load_model(
    model_dir: str | Path, *, threads: int | None = None, device: str | None = None
) -> Model:
    """``Model(model_dir)``, its sessions limited to ``threads`` threads each when given, on
    ``device`` when given (as ``--device``)."""
    if not Path(model_dir).is_dir():
        raise GenaiRuntimeError(f"model folder not found: {model_dir}")
    config = Config(str(model_dir))
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise GenaiRuntimeError(f"threads: expected an integer >= 1, got {shown(threads)}")
        config.overlay(threads_overlay(config, threads))
    if device:
        config.use_device(device)
    return Model(config)


def start_engine(
    model_dir: str | Path,
    *,
    threads: int | None = None,
    device: str | None = None,
    adapters: Mapping[str, str] | None = None,
    **engine_options: Any,
):
    """Load a model (and its LoRA ``adapters``, name -> ``.onnx_adapter`` path, and a
    ``draft_model`` folder) and start the server's engine thread over it."""
    from ..server import engine_over

    model = load_model(model_dir, threads=threads, device=device)
    draft_dir = engine_options.pop("draft_model", None)
    if draft_dir is not None:
        engine_options["draft"] = load_model(draft_dir, threads=threads, device=device)
    return engine_over(model, adapters, **engine_options)
