"""Batch inference with Ray Data: a callable class for ``Dataset.map_batches``.

Ray Data builds one ``BatchPredictor`` per actor (the model loads once, in ``__init__``) and
calls it with batches: a dict of columns (numpy, Ray's default) or a pandas DataFrame. Each row
has a ``prompt`` (text) or ``messages`` (chat messages) and may override the defaults with its
own ``max_tokens``, ``temperature``, ``top_p``, ``top_k`` and ``seed`` (a missing value, None or
NaN, keeps the default). The batch is decoded together (``BatchRunner``) and comes back with
its columns plus ``generated_text``, ``num_tokens``, ``finish_reason`` ("stop", "length" or
"error") and ``error`` (None, or why the row failed: the other rows are unaffected).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import GenaiRuntimeError, GenerationError
from ...tokenizer import Tokenizer
from ..batch import BatchRunner, RowResult, RowSettings
from ..loading import load_model
from .serve import require_ray

SETTINGS = ("max_tokens", "temperature", "top_p", "top_k", "seed")
OUTPUTS = ("generated_text", "num_tokens", "finish_reason", "error")


class BatchPredictor:
    """``map_batches`` callable: ``rows`` prompts decode at once (make it the batch size);
    ``chat``: a ``prompt`` is sent as one user message through the chat template (False: as
    raw text); ``token_ids`` adds a ``generated_token_ids`` column."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        rows: int = 8,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        chat: bool = True,
        threads: int | None = None,
        max_context: int | None = None,
        token_ids: bool = False,
    ):
        self.defaults = RowSettings(max_tokens, temperature, top_p, top_k, seed)
        self.chat = chat
        self.token_ids = token_ids
        model = load_model(model_dir, threads=threads)
        self.tokenizer = Tokenizer(model)
        self.runner = BatchRunner(model, self.tokenizer, rows=rows, max_context=max_context)

    def __call__(self, batch: Any) -> Any:
        columns = _columns(batch)
        n = _row_count(columns)
        results: list[RowResult | None] = [None] * n
        runnable: list[int] = []
        prompts: list[np.ndarray] = []
        settings: list[RowSettings] = []
        for i in range(n):
            try:
                prompt = self._prompt(columns, i)
                row_settings = self._settings(columns, i)
            except GenaiRuntimeError as exc:
                results[i] = RowResult(error=str(exc))
                continue
            runnable.append(i)
            prompts.append(prompt)
            settings.append(row_settings)
        for i, result in zip(runnable, self.runner.run(prompts, settings)):
            results[i] = result
        outputs = _outputs(results, self.token_ids)  # type: ignore[arg-type]
        if isinstance(batch, Mapping):
            return {**batch, **outputs}
        return batch.assign(**outputs)  # a pandas DataFrame

    def _prompt(self, columns: Mapping[str, Any], i: int) -> np.ndarray:
        if "messages" in columns:
            messages = _messages(columns["messages"][i])
        else:
            prompt = columns["prompt"][i]
            if not isinstance(prompt, str):
                raise GenerationError(f"prompt: expected a string, got {type(prompt).__name__}")
            if not self.chat:
                return self.tokenizer.encode_prompt(prompt)
            messages = [{"role": "user", "content": prompt}]
        return self.tokenizer.encode_chat(messages)

    def _settings(self, columns: Mapping[str, Any], i: int) -> RowSettings:
        values = {}
        for name in SETTINGS:
            if name in columns:
                value = _scalar(columns[name][i])
                if value is not None:
                    values[name] = value
        if not values:
            return self.defaults
        merged = {name: getattr(self.defaults, name) for name in SETTINGS} | values
        return RowSettings(**merged)


def _columns(batch: Any) -> Mapping[str, Any]:
    if isinstance(batch, Mapping):
        columns = batch
    elif hasattr(batch, "columns") and hasattr(batch, "to_numpy"):  # pandas, without importing it
        columns = {str(name): batch[name].to_numpy() for name in batch.columns}
    else:
        raise GenerationError(
            f"a batch must be a dict of columns or a pandas DataFrame, got {type(batch).__name__}"
        )
    if "prompt" not in columns and "messages" not in columns:
        raise GenerationError(
            f"a batch needs a 'prompt' or a 'messages' column; it has {sorted(columns)}"
        )
    clash = sorted(set(OUTPUTS) & set(columns))
    if clash:
        raise GenerationError(f"the batch already has output columns {clash}")
    return columns


def _row_count(columns: Mapping[str, Any]) -> int:
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        raise GenerationError(f"the batch's columns differ in length: {lengths}")
    return next(iter(lengths.values()), 0)


def _scalar(value: Any) -> Any:
    """A row's setting as a Python number; None for missing (None, NaN)."""
    if value is None:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if value.is_integer():  # an integer column with a gap becomes float in pandas
            return int(value) if abs(value) < 2**63 else value
    if not isinstance(value, numbers.Real):
        raise GenerationError(f"a row setting must be a number, got {type(value).__name__}")
    return value


def _messages(value: Any) -> list[dict[str, str]]:
    """Chat messages as Ray hands them over (a list, or a numpy array of dicts)."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence | np.ndarray):
        raise GenerationError(
            f"messages: expected a list of {{role, content}} objects, got {type(value).__name__}"
        )
    out = []
    for message in value:
        if not isinstance(message, Mapping):
            raise GenerationError(f"messages: each item must be an object, got {message!r:.40}")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            raise GenerationError("messages: each item needs a string role and a string content")
        out.append({"role": role, "content": content})
    return out


def _outputs(results: Sequence[RowResult], token_ids: bool) -> dict[str, np.ndarray]:
    outputs = {
        "generated_text": np.array([r.text for r in results], dtype=object),
        "num_tokens": np.array([r.num_tokens for r in results], dtype=np.int64),
        "finish_reason": np.array([r.finish_reason for r in results], dtype=object),
        "error": np.array([r.error for r in results], dtype=object),
    }
    if token_ids:
        ids = np.empty(len(results), dtype=object)
        ids[:] = [np.asarray(r.token_ids, np.int64) for r in results]
        outputs["generated_token_ids"] = ids
    return outputs


def generate_dataset(
    ds: Any,
    model_dir: str | Path,
    *,
    actors: int = 1,
    batch_size: int = 8,
    threads: int = 1,
    **predictor_options: Any,
) -> Any:
    """``ds.map_batches(BatchPredictor, ...)`` over ``actors`` actors, each reserving ``threads``
    CPUs and decoding ``batch_size`` rows at once. Lazy, like every Ray Data transform. Rows come
    back in input order when the dataset's context says ``execution_options.preserve_order``."""
    data = require_ray("ray.data")
    options = {"rows": batch_size, "threads": threads, **predictor_options}
    return ds.map_batches(
        BatchPredictor,
        fn_constructor_args=(str(model_dir),),
        fn_constructor_kwargs=options,
        batch_size=batch_size,
        compute=data.ActorPoolStrategy(size=actors),
        num_cpus=threads,
    )
