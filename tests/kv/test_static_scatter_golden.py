"""The reference's static-scatter fixture (TensorScatter + Attention-24, 3-D ``key_cache.%d``):
our passes feed exactly the recorded inputs and reproduce every recorded output."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require_shared

import genai_runtime as og
from genai_runtime.runtime.executor import Executor

FIXTURE = ("fixtures", "onnxruntime-genai", "static-scatter-bias-decoder")


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    return dict(np.load(require_shared(*FIXTURE, "golden_io.npz")))


@pytest.fixture(scope="module")
def model() -> og.Model:
    return og.Model(require_shared(*FIXTURE))


def _check_pass(executor: Executor, golden: dict, phase: str, n: int) -> None:
    cache = executor.cache
    drivers = cache._drivers
    assert drivers.before.tolist() == golden[f"{phase}_in.write_indices"].tolist()
    assert drivers.after.tolist() == golden[f"{phase}_in.nonpad_kv_seqlen"].tolist()
    np.testing.assert_array_equal(
        executor.positions.positions(n), golden[f"{phase}_in.position_ids"]
    )
    names = [name for layer in cache.layout.past for name in layer]
    assert len(names) == len(cache.buffers()) == 4
    for name, buffer in zip(names, cache.buffers()):
        out = "updated_" + name
        np.testing.assert_allclose(buffer, golden[f"{phase}_out.{out}"], atol=1e-4, rtol=0)


def test_prefill_and_decode_reproduce_the_golden_io(model, golden) -> None:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=16)
    generator = og.Generator(model, params)
    assert generator.kv_plan.kind == "static-scatter"
    executor = generator._exec

    prompt = golden["prefill_in.input_ids"]
    logits = executor.forward(prompt)
    _check_pass(executor, golden, "prefill", prompt.shape[1])
    np.testing.assert_allclose(logits, golden["prefill_out.logits"][:, -1], atol=1e-4, rtol=0)
    np.testing.assert_allclose(
        executor.output("logits"), golden["prefill_out.logits"], atol=1e-4, rtol=0
    )
    buffers_before = [b.__array_interface__["data"][0] for b in executor.cache.buffers()]

    logits = executor.forward(golden["decode_in.input_ids"])
    _check_pass(executor, golden, "decode", 1)
    np.testing.assert_allclose(logits, golden["decode_out.logits"][:, -1], atol=1e-4, rtol=0)
    # Written in place: the same buffers, no per-step copy.
    assert [b.__array_interface__["data"][0] for b in executor.cache.buffers()] == buffers_before
    assert executor.cache.nbytes == 4 * 16 * 32 * 4


def test_public_api_matches_the_golden_logits(model, golden) -> None:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=16)
    generator = og.Generator(model, params)
    generator.append_tokens(golden["prefill_in.input_ids"])
    logits = generator.get_logits()
    np.testing.assert_allclose(
        logits.reshape(-1), golden["prefill_out.logits"][:, -1].reshape(-1), atol=1e-4, rtol=0
    )
    generator.append_tokens(golden["decode_in.input_ids"])
    logits = generator.get_logits()
    np.testing.assert_allclose(
        logits.reshape(-1), golden["decode_out.logits"].reshape(-1), atol=1e-4, rtol=0
    )
