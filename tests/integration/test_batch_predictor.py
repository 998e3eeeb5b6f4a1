"""The batch runner and the Ray Data predictor, without Ray: the real 2-layer SmolLM2 (int4).

Greedy rows must equal onnxruntime-genai-style batched generation by our ``Generator``
(batch_size > 1, right-padded): both decode several rows per pass. A ``Generator`` with
batch_size 1 is not the reference for int4 models: onnxruntime's MatMulNBits rounds a one-row
pass differently (see docs/design/numerics.md).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require_shared

import genai_runtime as og
from genai_runtime.errors import GenerationError
from genai_runtime.integrations.batch import BatchRunner, RowSettings
from genai_runtime.integrations.ray.data import BatchPredictor

SMALL = "smollm2-135m-instruct-int4-2layers"
TOPICS = ["the sea", "a robot", "autumn", "coffee", "a lighthouse", "chess", "rain", "bees"]


@pytest.fixture(scope="module")
def small_dir():
    return str(require_shared("models", SMALL))


@pytest.fixture(scope="module")
def model(small_dir):
    return og.Model(small_dir)


@pytest.fixture(scope="module")
def tok(model):
    return og.Tokenizer(model)


def _chat_ids(tok, text: str) -> np.ndarray:
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


def _generator_greedy(model, prompts: list[np.ndarray], new_tokens: int) -> list[list[int]]:
    """Greedy tokens of each prompt from one right-padded Generator batch (EOS kept, then cut)."""
    width = max(len(p) for p in prompts)
    pad = model.spec.tokens.pad
    ids = np.full((len(prompts), width), pad, np.int32)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = p
    params = og.GeneratorParams(model)
    params.set_search_options(batch_size=len(prompts), max_length=width + new_tokens)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    steps = []
    while not gen.is_done() and len(steps) < new_tokens:
        gen.generate_next_token()
        steps.append(gen.get_next_tokens())
    eos = set(model.spec.tokens.eos)
    out = []
    for row in np.array(steps).T.tolist():
        cut = next((k + 1 for k, t in enumerate(row) if t in eos), len(row))
        out.append(row[:cut])
    return out


def test_greedy_rows_equal_the_batched_generator_in_order(model, tok):
    prompts = [_chat_ids(tok, f"Write one sentence about {t}.") for t in TOPICS]
    limits = [12, 5, 12, 9, 12, 1, 12, 7]
    reference = _generator_greedy(model, prompts, 12)
    # Three rows for eight prompts: rows are refilled as others finish, passes of 2-3 rows.
    runner = BatchRunner(model, tok, rows=3)
    results = runner.run(prompts, [RowSettings(max_tokens=m) for m in limits])
    for result, ref, limit in zip(results, reference, limits):
        assert result.error is None
        assert list(result.token_ids) == ref[:limit]
        ended = ref[:limit][-1] in model.spec.tokens.eos
        assert result.finish_reason == ("stop" if ended else "length")
        assert result.text == tok.decode(ref[:limit])
    assert len({r.token_ids for r in results}) > 4  # the prompts really differ


def test_predictor_columns_settings_and_failing_rows(small_dir, tok):
    predictor = BatchPredictor(small_dir, rows=4, max_tokens=6, max_context=128, token_ids=True)
    long_prompt = "word " * 200  # over the 128-token context
    prompts = ["Tell me a joke.", long_prompt, "Name a colour.", "Hi!", "Name a colour.",
               "Name a colour.", 7, "Count to three."]  # fmt: skip
    batch = {
        "prompt": np.array(prompts, dtype=object),
        "max_tokens": np.array([3, 4, np.nan, 5, 6, 6, 2, 4]),
        "temperature": np.array([0, 0, 0, 9.0, 1.0, 1.0, 0, 1.0]),
        "seed": np.array([None, None, None, None, 11, 11, None, 12], dtype=object),
        "id": np.arange(8),
    }
    out = predictor(batch)
    assert list(out["id"]) == list(range(8))  # input columns come back as they were
    reasons = list(out["finish_reason"])
    errors = list(out["error"])
    assert reasons[1] == "error" and "context is 128 tokens" in errors[1]
    assert reasons[3] == "error" and "temperature" in errors[3]
    assert reasons[6] == "error" and "prompt: expected a string" in errors[6]
    fine = [0, 2, 4, 5, 7]
    assert all(errors[i] is None and reasons[i] in ("stop", "length") for i in fine)
    assert out["num_tokens"][0] <= 3 and out["num_tokens"][2] <= 6  # NaN: the default
    assert [len(ids) for ids in out["generated_token_ids"]] == list(out["num_tokens"])
    # The same seed, prompt and settings give the same sample, whatever row it is in.
    assert list(out["generated_token_ids"][4]) == list(out["generated_token_ids"][5])
    again = predictor({"prompt": np.array(["Name a colour."], dtype=object),
                       "temperature": np.array([1.0]), "seed": np.array([11])})  # fmt: skip
    assert again["generated_text"][0] == out["generated_text"][4]
    # Greedy rows do not depend on the company they keep.
    alone = predictor({"prompt": np.array(["Tell me a joke."]), "max_tokens": np.array([3])})
    assert alone["generated_text"][0] == out["generated_text"][0]


def test_predictor_messages_and_pandas(small_dir):
    pd = pytest.importorskip("pandas")
    predictor = BatchPredictor(small_dir, rows=2, max_tokens=4)
    messages = [[{"role": "user", "content": "Name a fruit."}], "not a list"]
    out = predictor(pd.DataFrame({"messages": messages}))
    assert isinstance(out, pd.DataFrame) and list(out["finish_reason"])[1] == "error"
    plain = predictor({"prompt": np.array(["Name a fruit."])})
    assert out["generated_text"][0] == plain["generated_text"][0]  # same chat prompt


def test_predictor_refuses_bad_batches_and_settings(small_dir):
    with pytest.raises(GenerationError, match="temperature"):
        RowSettings(temperature=float("nan"))
    with pytest.raises(GenerationError, match="max_tokens"):
        RowSettings(max_tokens=0)
    predictor = BatchPredictor(small_dir, rows=2, max_tokens=2)
    with pytest.raises(GenerationError, match="'prompt' or a 'messages' column"):
        predictor({"text": np.array(["hi"])})
    with pytest.raises(GenerationError, match="output columns"):
        predictor({"prompt": np.array(["hi"]), "error": np.array([None])})
    with pytest.raises(GenerationError, match="differ in length"):
        predictor({"prompt": np.array(["hi", "yo"]), "seed": np.array([1])})
