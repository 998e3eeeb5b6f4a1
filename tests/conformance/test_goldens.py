"""Greedy parity with onnxruntime-genai 0.18.0: every decoder golden, token for token, and the
prefill logits within 1e-3 of the goldens' top-20.

The pipeline goldens (embeddings -> transformer -> lm_head, three sessions chained by wires) run
through the same generic executor as the single-decoder ones.

A golden is the reference's output on the CPU that recorded it. int4 MatMulNBits picks its
kernel by CPU features, so on another CPU the reference itself departs from the int4 goldens
(seen on an AMD EPYC: prefill logits up to 0.61 apart, tokens from index 41). Each case therefore
runs the reference beside us: where it reproduces the golden we must too; where it does not, we
must reproduce what it gives on this machine, and the drift is reported, not hidden.
"""

from __future__ import annotations

import functools
import importlib
import os

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


def _reference_module():
    if os.environ.get("CI", "").lower() == "true":
        return importlib.import_module("onnxruntime_genai")  # CI installs it: fail if missing
    return pytest.importorskip("onnxruntime_genai")


@functools.cache
def _reference_model(folder: str):
    return _reference_module().Model(str(require_shared(*folder.split("/"))))


def _cases(with_logits: bool = False):
    for name in GOLDENS:
        golden = load_golden(name)
        runs = golden["runs"]
        batch = runs[0]["options"]["batch_size"]
        for start in range(0, len(runs), batch):
            if with_logits and "prefill_last_logits_top20" not in runs[start]:
                continue
            yield pytest.param(golden["model"], runs[start : start + batch], id=f"{name}-{start}")


def _generate(folder: str, runs: list[dict], api=og):
    model = _model(folder) if api is og else _reference_model(folder)
    options = runs[0]["options"]
    params = api.GeneratorParams(model)
    params.set_search_options(**options)
    generator = api.Generator(model, params)
    width = max(len(r["input_ids"]) for r in runs)
    pad = _model(folder).spec.tokens.pad
    prompt = np.array(
        [r["input_ids"] + [pad] * (width - len(r["input_ids"])) for r in runs], np.int32
    )
    generator.append_tokens(prompt)
    logits = generator.get_logits()[:, 0, :]
    while not generator.is_done():
        generator.generate_next_token()
    return generator, logits


@functools.cache
def _reference_here(folder: str, case: str) -> tuple[list[list[int]], np.ndarray]:
    """The reference's sequences and prefill logits for one case, run on this machine."""
    runs = next(p.values[1] for p in _cases() if p.values[0] == folder and p.id == case)
    generator, logits = _generate(folder, runs, _reference_module())
    return [generator.get_sequence(row).tolist() for row in range(len(runs))], logits


def _expected(folder: str, case: str, runs: list[dict]) -> list[list[int]]:
    here, _ = _reference_here(folder, case)
    stored = [run["output_ids"] for run in runs]
    return stored if here == stored else here


CASES = list(_cases())


@pytest.mark.parametrize(("folder", "runs"), CASES, ids=[p.id for p in CASES])
def test_greedy_tokens_match_reference(folder: str, runs: list[dict], request) -> None:
    case = request.node.callspec.id
    generator, _ = _generate(folder, runs)
    ours = [generator.get_sequence(row).tolist() for row in range(len(runs))]
    assert ours == _expected(folder, case, runs)


@pytest.mark.parametrize(("folder", "runs"), CASES, ids=[p.id for p in CASES])
def test_reference_reproduces_golden_on_this_cpu(folder: str, runs: list[dict], request) -> None:
    """fp32 goldens must hold anywhere; int4 ones may drift with the CPU's kernels (reported)."""
    here, _ = _reference_here(folder, request.node.callspec.id)
    stored = [run["output_ids"] for run in runs]
    if here != stored:
        if "int4" not in folder:
            pytest.fail(f"the reference departs from its fp32 golden here: {here} != {stored}")
        row = next(i for i, (a, b) in enumerate(zip(here, stored)) if a != b)
        col = next(j for j, (a, b) in enumerate(zip(here[row], stored[row])) if a != b)
        pytest.skip(f"int4 kernels on this CPU: the reference departs at row {row}, index {col}")


@pytest.mark.parametrize(("folder", "runs"), list(_cases(with_logits=True)))
def test_prefill_logits_match_reference_top20(folder: str, runs: list[dict], request) -> None:
    _, logits = _generate(folder, runs)
    _, reference = _reference_here(folder, request.node.callspec.id)
    for row, run in enumerate(runs):
        top = run["prefill_last_logits_top20"]
        ids = [t[0] for t in top]
        stored = np.array([t[1] for t in top])
        if np.abs(reference[row, ids] - stored).max() > 1e-3:  # another CPU: compare here
            ids = np.argsort(-reference[row], kind="stable")[:20].tolist()
            stored = reference[row, ids]
        np.testing.assert_allclose(logits[row, ids], stored, atol=1e-3, rtol=0)
        assert np.argsort(-logits[row], kind="stable")[:20].tolist() == ids
        np.testing.assert_allclose(logits[row], reference[row], atol=1e-3, rtol=0)
