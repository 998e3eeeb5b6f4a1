"""A draft model for the batched server's rows, against real models.

On an fp32 folder (exact arithmetic) the replies are the plain server's token for token, greedy
and seeded sampled, whatever the draft model says: with the model as its own draft nearly every
draft is kept. How a draft slot follows its row (kept prefixes, rewinds where a row's tokens
left the drafts) is checked on the draft model's slots alone.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import captured_logs, require_shared

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("onnx")

from test_server_speculation import _answers, _bodies, _metrics, _together

import genai_runtime as og
from genai_runtime.batching.draft_model import BatchDraftModel, check_draft_model
from genai_runtime.batching.speculation import (
    DRAFTED,
    DraftSteps,
    RowDrafts,
    RowOffer,
    WidthCosts,
    choose_width,
)
from genai_runtime.errors import GenaiRuntimeError, ModelError
from genai_runtime.server import ServeOptions, ServerHandle


@pytest.fixture(scope="module")
def other_fp32_folder(tmp_path_factory) -> Path:
    """A second tiny random model, other weights, the same vocabulary as ``tiny_fp32_folder``."""
    gguf_models = pytest.importorskip("gguf_models", reason="needs the gguf extra")
    from genai_runtime.importer import import_gguf

    base = tmp_path_factory.mktemp("tiny-fp32-other")
    gguf = gguf_models.write_tiny_gguf(
        base / "other.gguf", qtype=gguf_models.Q.Q8_0, seed=1, dims={"ctx": 1024}
    )
    return import_gguf(gguf, base / "model", quant="fp32", accuracy_level=0).out_dir


def _serve(folder: Path, speculate: int, draft: Path | None = None) -> ServerHandle:
    return ServerHandle(str(folder), port=0, max_active=4, speculate=speculate,
                        draft_model=None if draft is None else str(draft),
                        prompt_cache_mb=0, prefix_reuse=False).start()  # fmt: skip


def _replies(handle: ServerHandle) -> tuple[list, dict, dict]:
    """Four greedy and four seeded sampled replies, and the counters after each four."""
    greedy = _bodies(temperature=0)
    sampled = [{**b, "temperature": 0.9, "top_p": 0.95, "seed": 7 + i}
               for i, b in enumerate(_bodies())]  # fmt: skip
    try:
        answers = _answers(_together(handle, greedy))
        after_greedy = _metrics(handle)
        answers += _answers(_together(handle, sampled))
        return answers, after_greedy, _metrics(handle)
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def plain(tiny_fp32_folder: Path) -> list:
    return _replies(_serve(tiny_fp32_folder, 0))[0]


def _same_tokens(ours: list, theirs: list) -> None:
    for a, b in zip(ours, theirs):
        assert [t for t, _ in a[1]] == [t for t, _ in b[1]]
        assert a[0] == b[0] and a[2] == b[2]


def test_the_model_as_its_own_draft_keeps_nearly_every_draft(
    tiny_fp32_folder: Path, plain: list
) -> None:
    with captured_logs("genai_runtime.server") as logs:
        handle = _serve(tiny_fp32_folder, 6, tiny_fp32_folder)
    assert f"speculation: draft model {tiny_fp32_folder}, up to 6 drafts" in logs[0]
    answers, greedy, _ = _replies(handle)
    _same_tokens(answers, plain)
    drafted = greedy["genai_speculative_draft_tokens_total"]
    kept = greedy["genai_speculative_accepted_tokens_total"]
    # how many rounds draft depends on measured costs (a tiny model's draft step costs about
    # as much as its own, so mostly probes), but greedy rows keep what the model drafts
    assert drafted > 0 and kept >= 0.9 * drafted


def test_an_unrelated_draft_model_changes_no_token(
    tiny_fp32_folder: Path, other_fp32_folder: Path, plain: list
) -> None:
    answers, _, counters = _replies(_serve(tiny_fp32_folder, 6, other_fp32_folder))
    _same_tokens(answers, plain)
    assert counters["genai_speculative_draft_tokens_total"] > 0


def test_draft_slots_keep_the_prefix_they_share_with_a_row(tiny_fp32_folder: Path) -> None:
    """A draft slot keeps the tokens it holds that the row's history starts with: a second
    proposal after one more token runs only that token (no prefill), a new history in the
    same slot keeps the common prefix, and a prompt prefilled with the model's needs no
    catching up."""
    model = og.Model(og.Config(str(tiny_fp32_folder)))
    drafter = BatchDraftModel(model, 2, 256)
    history = np.arange(5, 45, dtype=np.int64)
    (first,) = drafter.propose([(1, history, 4)])
    assert drafter.prefilled == history.size and first.size == 4
    longer = np.append(history, first[0])
    (second,) = drafter.propose([(1, longer, 4)])
    assert drafter.prefilled == 0  # the one new token ran in the batched step
    np.testing.assert_array_equal(second[:3], first[1:])  # greedy drafts continue alike
    other = np.concatenate([history[:20], np.arange(60, 72)])
    drafter.propose([(1, other, 2)])
    assert drafter.prefilled == 12  # the 20 shared tokens were kept
    (fourth,) = drafter.propose([(1, np.append(other, [3, 4, 5]), 2)])
    assert drafter.prefilled == 0  # a few tokens behind: fed in the batched steps
    (fresh,) = BatchDraftModel(model, 2, 256).propose([(0, np.append(other, [3, 4, 5]), 2)])
    np.testing.assert_array_equal(fourth, fresh)
    drafter.prefill(0, history)  # a prompt, as the model prefills it
    (third,) = drafter.propose([(0, longer, 4)])
    assert drafter.prefilled == 0
    np.testing.assert_array_equal(third, second)


def test_the_draft_models_cost_counts_against_its_drafts() -> None:
    costs = WidthCosts()
    sure = RowDrafts(8)
    for _ in range(6):
        sure.kept(4, 4, DRAFTED)
    offers = [RowOffer(sure, 8, DRAFTED, 100, 100.0)] * 4
    assert choose_width(offers, costs, 8, DraftSteps(0.1, 0.1)) > 2
    # a draft model as slow as the model itself never pays
    assert choose_width(offers, costs, 8, DraftSteps(1.0, 1.0)) == 1
    # nor one whose catching up (a row far behind prefilling) outweighs what it drafts
    assert choose_width(offers, costs, 8, DraftSteps(0.1, 6.0)) == 1


def test_draft_model_options_are_checked(tiny_fp32_folder: Path) -> None:
    with pytest.raises(GenaiRuntimeError, match="a draft model needs speculate"):
        ServeOptions(draft_model=str(tiny_fp32_folder))
    run = subprocess.run(
        [sys.executable, "-m", "genai_runtime", "serve", str(tiny_fp32_folder),
         "--draft-model", str(tiny_fp32_folder)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2
    assert "--draft-model needs --speculate N" in run.stderr
    with pytest.raises(GenaiRuntimeError, match=r"draft model .*nowhere"):
        _serve(tiny_fp32_folder, 4, tiny_fp32_folder / "nowhere")
    other = og.Model(og.Config(str(require_shared("models", "smollm2-135m-instruct-int4"))))
    with pytest.raises(ModelError, match="vocabulary has 49152 tokens"):
        check_draft_model(og.Model(og.Config(str(tiny_fp32_folder))), other)
