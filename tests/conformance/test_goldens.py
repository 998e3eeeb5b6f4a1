"""Greedy parity with onnxruntime-genai 0.18.0: every decoder golden, token for token, and the
prefill logits within 1e-3 of the goldens' top-20.

The pipeline goldens (embeddings -> transformer -> lm_head, three sessions chained by wires) run
through the same generic executor as the single-decoder ones.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from conftest import load_golden, require_shared

import genai_runtime as og

GOLDENS = [
    "gpt2-tiny-single",
    "gpt2-tiny-batch",
    "smollm2-int4-plain",
    "smollm2-int4-penalty",
    "smollm2-int4-chat",
    "smollm2-int4-chat-batch",
    "pipeline-tiny",
    "speculative-tiny-draft",
]


@functools.cache
def _model(folder: str) -> og.Model:
    return og.Model(require_shared(*folder.split("/")))


def _cases(with_logits: bool = False):
    for name in GOLDENS:
        golden = load_golden(name)
        runs = golden["runs"]
        batch = runs[0]["options"]["batch_size"]
        for start in range(0, len(runs), batch):
            if with_logits and "prefill_last_logits_top20" not in runs[start]:
                continue
            yield pytest.param(golden["model"], runs[start : start + batch], id=f"{name}-{start}")


def _generate(model: og.Model, runs: list[dict]):
    options = runs[0]["options"]
    params = og.GeneratorParams(model)
    params.set_search_options(**options)
    generator = og.Generator(model, params)
    width = max(len(r["input_ids"]) for r in runs)
    pad = model.spec.tokens.pad
    prompt = np.array([r["input_ids"] + [pad] * (width - len(r["input_ids"])) for r in runs])
    generator.append_tokens(prompt)
    logits = generator.get_logits()[:, 0, :]
    while not generator.is_done():
        generator.generate_next_token()
    return generator, logits


@pytest.mark.parametrize(("folder", "runs"), list(_cases()))
def test_greedy_tokens_match_reference(folder: str, runs: list[dict]) -> None:
    generator, _ = _generate(_model(folder), runs)
    for row, run in enumerate(runs):
        assert generator.get_sequence(row).tolist() == run["output_ids"]


@pytest.mark.parametrize(("folder", "runs"), list(_cases(with_logits=True)))
def test_prefill_logits_match_reference_top20(folder: str, runs: list[dict]) -> None:
    _, logits = _generate(_model(folder), runs)
    for row, run in enumerate(runs):
        top = run["prefill_last_logits_top20"]
        ids = [t[0] for t in top]
        np.testing.assert_allclose(logits[row, ids], [t[1] for t in top], atol=1e-3, rtol=0)
        assert np.argsort(-logits[row], kind="stable")[:20].tolist() == ids
        assert logits[row].sum() == pytest.approx(run["prefill_last_logits_sum"], rel=1e-5)
