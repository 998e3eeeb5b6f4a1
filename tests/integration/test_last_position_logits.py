"""The last-position switch in imported graphs: a prompt pass asks the graph for each row's last
logits only (the lm_head skips every other position), and nothing a caller reads changes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import genai_runtime as og
from genai_runtime.importer import import_gguf
from genai_runtime.session.graph_io import LAST_POSITION_SWITCH

gguf_models = pytest.importorskip("gguf_models", reason="needs the gguf extra")

PROMPTS = [[5, 80, 259, 260, 261, 44, 1, 70, 90], [7, 31, 200, 12]]


def _imported(tmp_path_factory, quant: str, level: int) -> tuple[Path, Path, str]:
    base = tmp_path_factory.mktemp("last-position")
    gguf = gguf_models.write_tiny_gguf(base / "tiny.gguf", qtype=gguf_models.Q.Q8_0)
    out = import_gguf(gguf, base / "model", quant=quant, accuracy_level=level).out_dir
    return gguf, out, quant


@pytest.fixture(scope="module", params=[("fp32", 0), ("int4", 4)], ids=["fp32", "int4-level4"])
def folder(request, tmp_path_factory) -> tuple[Path, Path, str]:
    return _imported(tmp_path_factory, *request.param)


@pytest.fixture(scope="module")
def fp32_folder(tmp_path_factory) -> tuple[Path, Path, str]:
    # fp32 only: int4 rounds a batched server pass differently from a one-row run (see
    # docs/design/numerics.md).
    return _imported(tmp_path_factory, "fp32", 0)


def session_logits(out: Path, switch: bool | None) -> np.ndarray:
    """One onnxruntime call over both prompts, right-padded, with an empty KV cache."""
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    width = max(map(len, PROMPTS))
    ids = np.zeros((2, width), np.int64)
    mask = np.zeros((2, width), np.int64)
    for row, prompt in enumerate(PROMPTS):
        ids[row, : len(prompt)] = prompt
        mask[row, : len(prompt)] = 1
    feeds = {"input_ids": ids, "attention_mask": mask}
    for inp in sess.get_inputs():
        if inp.name.startswith("past_key_values"):
            feeds[inp.name] = np.zeros((2, inp.shape[1], 0, inp.shape[3]), np.float32)
    if switch is not None:
        feeds[LAST_POSITION_SWITCH] = np.array(switch)
    return sess.run(["logits"], feeds)[0]


def test_the_switch_is_an_input_with_a_default_so_other_runtimes_need_not_feed_it(folder):
    _, out, _ = folder
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert LAST_POSITION_SWITCH not in {i.name for i in sess.get_inputs()}
    assert LAST_POSITION_SWITCH in {i.name for i in sess.get_overridable_initializers()}
    unfed, off = session_logits(out, None), session_logits(out, False)
    assert unfed.shape == (2, len(PROMPTS[0]), off.shape[2])
    np.testing.assert_array_equal(unfed, off)


def test_switched_on_the_graph_returns_each_rows_last_real_position(folder):
    gguf, out, quant = folder
    every, last = session_logits(out, False), session_logits(out, True)
    assert last.shape == (2, 1, every.shape[2])
    for row, prompt in enumerate(PROMPTS):
        # Each row's logits depend on its own hidden state only: exactly the full pass's row.
        np.testing.assert_array_equal(last[row, 0], every[row, len(prompt) - 1])
        if quant == "fp32":  # and the math is the model's: a NumPy forward pass of the GGUF
            reference = gguf_models.numpy_logits(gguf, prompt)[-1]
            np.testing.assert_allclose(last[row, 0], reference, atol=1e-3)


def test_generation_reads_the_same_logits_and_get_output_still_holds_every_position(folder):
    _, out, _ = folder
    model = og.Model(str(out))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=32, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(PROMPTS[0])
    # The pass really was cut: its logits buffer holds one position (read-only peek).
    assert gen._exec.logits.last.shape == (1, 1, model.vocab_size)
    every = session_logits(out, False)[0, : len(PROMPTS[0])]
    np.testing.assert_allclose(gen.get_logits().reshape(-1), every[-1], atol=1e-5)
    # The prompt pass was cut to its last position; get_output reruns it for every one.
    full = gen.get_output("logits")
    assert full.shape == (1, len(PROMPTS[0]), every.shape[1])
    np.testing.assert_allclose(full[0], every, atol=1e-5)
    gen.generate_next_token()  # the rerun left the generator where it was
    assert int(gen.get_next_tokens()[0]) == int(every[-1].argmax())
    assert len(gen.get_sequence(0)) == len(PROMPTS[0]) + 1


def test_a_right_padded_batch_reads_each_rows_last_real_token(folder):
    _, out, _ = folder
    model = og.Model(str(out))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=32, do_sample=False, batch_size=len(PROMPTS))
    gen = og.Generator(model, params)
    pad = model.spec.tokens.pad
    assert pad is not None and all(pad not in p for p in PROMPTS)
    batch = np.full((len(PROMPTS), max(map(len, PROMPTS))), pad, np.int32)
    for row, prompt in enumerate(PROMPTS):
        batch[row, : len(prompt)] = prompt
    gen.append_tokens(batch)
    assert gen._exec.logits.last.shape == (len(PROMPTS), 1, model.vocab_size)  # cut, as above
    every = session_logits(out, False)
    expected = np.stack([every[row, len(p) - 1] for row, p in enumerate(PROMPTS)])
    np.testing.assert_allclose(gen.get_logits().reshape(len(PROMPTS), -1), expected, atol=1e-5)


def test_the_server_prefills_with_the_switch_and_answers_as_full_runs_do(fp32_folder):
    """Prompts prefilled into rows of the server's batched cache (two at once, then one that
    reuses a finished row's prefix) give the greedy text of plain full-sequence runs."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from genai_runtime.server import ServerHandle

    _, out, _ = fp32_folder
    model = og.Model(str(out))
    tokenizer = og.Tokenizer(model)

    def reference_text(prompt: str) -> str:
        """Greedy by plain onnxruntime calls over the whole sequence, the switch left off."""
        sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
        ids = [int(i) for i in tokenizer.encode_prompt(prompt)]
        start = len(ids)
        for _ in range(12):
            feeds = {"input_ids": np.asarray([ids], np.int64),
                     "attention_mask": np.ones((1, len(ids)), np.int64)}  # fmt: skip
            for inp in sess.get_inputs():
                if inp.name.startswith("past_key_values"):
                    feeds[inp.name] = np.zeros((1, inp.shape[1], 0, inp.shape[3]), np.float32)
            ids.append(int(sess.run(["logits"], feeds)[0][0, -1].argmax()))
        # The server holds back a trailing incomplete UTF-8 character; decode shows it as U+FFFD.
        return tokenizer.decode(ids[start:]).rstrip("\ufffd")

    prompts = ["abc def", "hello there friend", "hello there friend and more"]
    handle = ServerHandle(str(out), port=0, max_active=2).start()
    try:
        client = openai.OpenAI(base_url=handle.url + "/v1", api_key="x", max_retries=0)

        def served(prompt: str) -> str:
            reply = client.completions.create(
                model=handle.state.served_name, prompt=prompt, temperature=0, max_tokens=12,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            return reply.choices[0].text

        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(served, prompts[:2]))
        later = served(prompts[2])  # starts with prompts[1]: its row's prefix is reused
    finally:
        handle.stop()
    assert [*together, later] == [reference_text(p) for p in prompts]


def test_a_verify_pass_runs_once_and_scores_every_token(fp32_folder, monkeypatch):
    """Speculative verification reads every position's logits: it asks the graph for them all
    in its one pass (a pass asked for the last ones only would have to run again)."""
    from genai_runtime.runtime.driver import forward_rows
    from genai_runtime.session.bound import BoundSession

    _, out, _ = fp32_folder
    model = og.Model(str(out))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=64)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([PROMPTS[0]], np.int32))
    executor = generator._exec
    start = executor.length
    drafts = np.array([44, 1, 70, 90], np.int32)
    runs = []
    real_run = BoundSession.run
    monkeypatch.setattr(BoundSession, "run", lambda self, *a: runs.append(1) or real_run(self, *a))
    rows = forward_rows(executor, drafts).copy()
    assert len(runs) == 1  # the real session ran once; the counter only counts
    executor.rewind_to(start)
    one_by_one = [forward_rows(executor, drafts[i : i + 1])[0].copy() for i in range(4)]
    np.testing.assert_allclose(rows, np.stack(one_by_one), atol=1e-4)
