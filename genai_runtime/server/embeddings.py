"""``POST /v1/embeddings``: a pooled, L2-normalised hidden state per input, for model folders
whose graph outputs its hidden states.

The onnxruntime-genai builder adds the output with ``--extra_options include_hidden_states=true``
(``hidden_states``, ``[batch, sequence, hidden]``; a config may name it under the decoder's
``outputs.hidden_states``). Each input runs alone through a fresh ``Generator`` on the engine
thread, between decode steps, so chat requests keep the model's slots. How a sequence's states
become one vector is the folder's: a sentence-transformers pooling config (``modules.json``'s
Pooling module, else ``1_Pooling/config.json``) chooses last-token, mean, CLS (first) or max
pooling; a folder without one gets last-token pooling, which suits a causal model (its last
position has seen every token). Vectors are L2-normalised; ``dimensions`` keeps the first N
components and normalises again.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import GenaiRuntimeError, ModelError
from ..folder_paths import folder_file
from .access_log import note_ignored, note_usage
from .protocol import MAX_TOKEN_ID, APIError, bad

MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request
MAX_CONFIG_BYTES = 1 << 16
# sentence-transformers' pooling switches and the pooling each one names
POOLING_MODES = {
    "pooling_mode_lasttoken": "last",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
}
UNSUPPORTED_MODES = ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")
FORMATS = ("float", "base64")
FIELDS = frozenset({"model", "input", "encoding_format", "dimensions", "user"})


@dataclass(frozen=True)
class Embedder:
    """How the served model embeds: the graph output holding its hidden states, its width, and
    how they are pooled."""

    output: str
    width: int | None
    pooling: str  # a value of POOLING_MODES


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str
    inputs: tuple[str | list[int], ...]
    encoding_format: str
    dimensions: int | None


def hidden_output(model: Any) -> tuple[str, int | None] | None:
    """(name, width) of the hidden states the model's last stage to give them outputs (the
    config's ``hidden_states`` output role, else a graph output so named); None if none does."""
    for stage in reversed(model.plan.stages):
        name = stage.session.outputs.get("hidden_states", "hidden_states")
        info = stage.io.outputs.get(name)
        if info is not None:
            width = info.shape[-1] if info.shape and isinstance(info.shape[-1], int) else None
            return name, width
    return None


def folder_pooling(folder: Path) -> str:
    """The pooling a sentence-transformers config in ``folder`` names ("last" without one)."""
    where = "1_Pooling"
    modules = folder / "modules.json"
    if modules.is_file():
        for module in _json(folder, "modules.json"):
            if isinstance(module, dict) and str(module.get("type", "")).endswith("Pooling"):
                where = str(module.get("path") or where)
    name = f"{where}/config.json"
    if not (folder / name).is_file():
        return "last"
    config = _json(folder, name)
    if not isinstance(config, dict):
        raise ModelError(f"{name}: expected a JSON object")
    chosen = [POOLING_MODES[k] for k in POOLING_MODES if config.get(k) is True]
    odd = [k for k in UNSUPPORTED_MODES if config.get(k) is True]
    if odd or len(chosen) != 1:
        raise ModelError(
            f"{name}: embeddings pool with exactly one of {', '.join(POOLING_MODES)}; it says "
            f"{', '.join(odd + [k for k in POOLING_MODES if config.get(k) is True]) or 'none'}"
        )
    return chosen[0]


def _json(folder: Path, name: str) -> Any:
    path = folder_file(folder, name)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ModelError(f"{name} is larger than {MAX_CONFIG_BYTES} bytes")
        return json.loads(data.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ModelError(f"{name} could not be read as JSON: {str(exc)[:200]}") from None


def embedder_of(model: Any) -> Embedder:
    """The served model's ``Embedder``; a 400 naming why when it cannot embed."""
    found = hidden_output(model)
    if found is None:
        raise APIError(
            400,
            "this model cannot embed: its graph has no hidden_states output (export it with "
            "the onnxruntime-genai builder's --extra_options include_hidden_states=true)",
            param="model",
            code="embeddings_unsupported",
        )
    try:
        pooling = folder_pooling(Path(model.model_dir))
    except GenaiRuntimeError as exc:
        raise APIError(400, f"this model cannot embed: {exc}", param="model",
                       code="embeddings_unsupported") from None  # fmt: skip
    return Embedder(found[0], found[1], pooling)


def parse_embeddings(body: Any) -> EmbeddingRequest:
    """An embeddings request body, checked field by field (400 naming the field)."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model is required and must be a string (a served model name)", "model")
    raw = body.get("input")
    if isinstance(raw, str) or (isinstance(raw, list) and raw and all(_is_id(t) for t in raw)):
        inputs: list[Any] = [raw]
    elif isinstance(raw, list) and raw:
        inputs = raw
    else:
        raise bad("input must be a string, a list of strings, a list of token ids or a list of "
                  "such lists", "input")  # fmt: skip
    if len(inputs) > MAX_INPUTS:
        raise bad(f"input holds {len(inputs)} inputs; at most {MAX_INPUTS}", "input")
    for i, one in enumerate(inputs):
        where = f"input[{i}]"
        if isinstance(one, str):
            if not one:
                raise bad(f"{where} is an empty string", "input")
            try:
                one.encode("utf-8")
            except UnicodeEncodeError:
                raise bad(f"{where} holds a lone UTF-16 surrogate", "input") from None
        elif not (isinstance(one, list) and one and all(_is_id(t) for t in one)):
            raise bad(f"{where} must be a non-empty string or list of token ids", "input")
    fmt = body.get("encoding_format")
    fmt = "float" if fmt is None else fmt
    if fmt not in FORMATS:
        raise bad(f"encoding_format must be one of {', '.join(FORMATS)}", "encoding_format")
    dims = body.get("dimensions")
    if dims is not None and (not _is_id(dims) or dims < 1):
        raise bad("dimensions must be a positive integer", "dimensions")
    return EmbeddingRequest(model, tuple(inputs), fmt, dims)


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKEN_ID


def token_ids(eng: Any, one: str | list[int], context: int) -> np.ndarray:
    """The ids one input runs as (text through the tokenizer, BOS as it wants); runs on a
    worker thread."""
    if isinstance(one, str):
        try:
            ids = np.asarray(eng.tokenizer.encode_prompt(one), np.int64)
        except GenaiRuntimeError as exc:
            raise bad(f"the input could not be tokenized: {exc}", "input") from exc
    else:
        ids = np.asarray(one, np.int64)
        vocab = eng.model.vocab_size or 0
        if ids.max() >= vocab:
            raise bad(f"input token ids must be in [0, {vocab})", "input")
    if ids.size == 0:
        raise bad("an input encodes to no tokens", "input")
    if ids.size > context:
        raise bad(f"an input has {ids.size} tokens; the served context is {context}", "input",
                  "context_length_exceeded")  # fmt: skip
    return ids


def hidden_states(model: Any, embedder: Embedder, ids: np.ndarray) -> np.ndarray:
    """The model's hidden states ``[T, H]`` for ``ids``, in float32; runs on the engine thread.
    The prompt goes in as whole passes of the config's chunk size (one pass without one), each
    pass's states read back."""
    generator = model.new_generator(max_length=int(ids.size) + 1)
    step = generator.search.chunk_size or ids.size
    parts = []
    for first in range(0, ids.size, step):
        piece = ids[first : first + step]
        generator.append_tokens(piece[None, :])
        states = np.asarray(generator.get_output(embedder.output), np.float32)
        if states.ndim != 3 or states.shape[:2] != (1, piece.size):
            raise GenaiRuntimeError(
                f"{embedder.output} came back shaped {list(states.shape)} for a pass of "
                f"{piece.size} tokens; expected [1, {piece.size}, hidden]"
            )
        parts.append(states[0])
    return np.concatenate(parts)


def pooled(states: np.ndarray, pooling: str, dimensions: int | None = None) -> np.ndarray:
    """One L2-normalised float32 vector from ``[T, H]`` states (its first ``dimensions``)."""
    states = states.astype(np.float64)
    if pooling == "mean":
        vector = states.mean(axis=0)
    elif pooling == "max":
        vector = states.max(axis=0)
    elif pooling == "cls":
        vector = states[0]
    else:
        vector = states[-1]
    vector = vector[:dimensions]
    norm = float(np.linalg.norm(vector))
    return (vector / norm if norm > 0 else vector).astype(np.float32)


def embeddings_route(
    state: Any,
    authorize: Callable[[Request], None],
    engine: Callable[[], Any],
    read_json: Callable[[Request], Awaitable[Any]],
) -> Route:
    """The route, sharing the app's state, API-key check, engine lookup and body reader."""
    made: dict[int, Embedder] = {}  # id(model) -> its embedder, worked out once

    async def embeddings(request: Request) -> Response:
        authorize(request)
        body = await read_json(request)
        parsed = parse_embeddings(body)
        note_ignored(request.scope, tuple(sorted(k for k in body if k not in FIELDS)))
        eng = engine()
        if parsed.model != state.served_name:
            shown = parsed.model if len(parsed.model) <= 64 else parsed.model[:61] + "..."
            raise APIError(404, f"the model {shown!r} is not served here for embeddings "
                           f"(served: {state.served_name!r})", param="model",
                           code="model_not_found")  # fmt: skip
        key = id(eng.model)
        if key not in made:
            made[key] = embedder_of(eng.model)
        embedder = made[key]
        if parsed.dimensions is not None and embedder.width and parsed.dimensions > embedder.width:
            raise bad(f"dimensions must be at most {embedder.width} for this model", "dimensions")
        loop = asyncio.get_running_loop()
        data, total = [], 0
        for i, one in enumerate(parsed.inputs):
            ids = await loop.run_in_executor(state.workers, token_ids, eng, one, eng.context)
            try:
                states = await eng.between_steps(partial(hidden_states, eng.model, embedder, ids))
            except GenaiRuntimeError as exc:
                raise APIError(500, f"the model could not embed input {i}: {exc}",
                               type="server_error") from exc  # fmt: skip
            vector = pooled(states, embedder.pooling, parsed.dimensions)
            total += int(ids.size)
            value: Any = vector.tolist()
            if parsed.encoding_format == "base64":
                value = base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
            data.append({"object": "embedding", "index": i, "embedding": value})
        usage = {"prompt_tokens": total, "total_tokens": total}
        note_usage(request.scope, {**usage, "completion_tokens": 0})
        return JSONResponse({"object": "list", "data": data, "model": parsed.model, "usage": usage})

    return Route("/v1/embeddings", embeddings, methods=["POST"])
