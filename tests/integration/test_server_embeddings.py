"""``POST /v1/embeddings`` with the official ``openai`` client, checked against a NumPy forward
of the same weights.

The graph (``speculative_models.context_decoder``, built with ``onnx.helper``) outputs logits AND
``hidden_states`` (the running sum of the token embeddings), as a builder export with
``include_hidden_states=true`` does, named under the decoder's ``outputs`` in a v1
``genai_config.json``. Its vocabulary is SmolLM2's, so the folder takes SmolLM2's tokenizer and
chat template: the same server also chats. A folder whose graph gives no hidden states answers
a 400 naming why."""

from __future__ import annotations

import base64
import json
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import require_shared
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import speculative_models as sm

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from genai_runtime.errors import ModelError  # noqa: E402
from genai_runtime.server import ServerHandle  # noqa: E402
from genai_runtime.server.embeddings import folder_pooling  # noqa: E402

SMALL = "smollm2-135m-instruct-int4-2layers"
VOCAB = 49152
TEXTS = ["The capital of France is Paris.", "two", "Embeddings, pooled and normalised."]


def _weights() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    emb = rng.normal(0, 0.5, (VOCAB, sm.DIM)).astype(np.float32)
    head = rng.normal(0, 1.0, (sm.DIM, VOCAB)).astype(np.float32)
    return emb, head


def _folder(root: Path, name: str, *, pooling: dict | None = None) -> Path:
    """The context decoder over SmolLM2's tokenizer, with its hidden states in the config."""
    folder = root / name
    emb, head = _weights()
    sm.context_decoder(folder / "model.onnx", emb, head)
    source = require_shared("models", SMALL)
    for file in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(source / file, folder / file)
    decoder = {
        "filename": "model.onnx", "head_size": sm.DIM, "hidden_size": sm.DIM,
        "num_attention_heads": 1, "num_key_value_heads": 1, "num_hidden_layers": 1,
        "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                   "past_key_names": "past_key_values.%d.key",
                   "past_value_names": "past_key_values.%d.value"},
        "outputs": {"logits": "logits", "hidden_states": "hidden_states",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value"},
    }  # fmt: skip
    model = {"type": "llama", "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
             "vocab_size": VOCAB, "context_length": 256, "decoder": decoder}  # fmt: skip
    doc = {"model": model, "search": {"max_length": 256}}
    (folder / "genai_config.json").write_text(json.dumps(doc), encoding="utf-8")
    if pooling is not None:
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling), encoding="utf-8")
    return folder


def _reference(ids, pooling: str = "last", dimensions: int | None = None) -> np.ndarray:
    """The NumPy forward: hidden states are the running sum of the embeddings; pooled, cut to
    ``dimensions``, L2-normalised."""
    emb, _ = _weights()
    states = np.cumsum(emb[np.asarray(ids)].astype(np.float64), axis=0)
    vector = states.mean(axis=0) if pooling == "mean" else states[-1]
    vector = vector[:dimensions]
    return vector / np.linalg.norm(vector)


def _start(folder: Path):
    handle = ServerHandle(str(folder), port=0).start()
    client = openai.OpenAI(base_url=handle.url + "/v1", api_key="x", max_retries=0)
    return handle, client


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    handle, client = _start(_folder(tmp_path_factory.mktemp("embed"), "embedder"))
    yield handle, client
    handle.stop()


def _ids(handle, text: str) -> list[int]:
    return handle.state.engine.tokenizer.encode_prompt(text).tolist()


def test_each_text_is_its_last_hidden_state_normalised_as_numpy_computes_it(served):
    handle, client = served
    reply = client.embeddings.create(model=handle.state.served_name, input=TEXTS)
    assert reply.object == "list" and [d.index for d in reply.data] == [0, 1, 2]
    for text, item in zip(TEXTS, reply.data):
        assert item.object == "embedding"
        got = np.asarray(item.embedding)
        np.testing.assert_allclose(got, _reference(_ids(handle, text)), atol=1e-5)
        assert abs(np.linalg.norm(got) - 1) < 1e-5
    tokens = sum(len(_ids(handle, t)) for t in TEXTS)
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == tokens


def test_float_and_base64_token_ids_and_dimensions(served):
    handle, _ = served
    url, name = handle.url + "/v1/embeddings", handle.state.served_name
    ids = [5, 900, 12000, 4]
    plain = httpx.post(url, json={"model": name, "input": ids}, timeout=30).json()
    vector = np.asarray(plain["data"][0]["embedding"], np.float32)
    np.testing.assert_allclose(vector, _reference(ids), atol=1e-5)
    packed = httpx.post(url, json={"model": name, "input": [ids, [7]], "encoding_format": "base64"},
                        timeout=30).json()  # fmt: skip
    first = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), "<f4")
    np.testing.assert_array_equal(first, vector)  # the same float32 values, packed
    assert packed["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    cut = httpx.post(url, json={"model": name, "input": ids, "dimensions": 3}, timeout=30).json()
    np.testing.assert_allclose(cut["data"][0]["embedding"], _reference(ids, dimensions=3),
                               atol=1e-5)  # fmt: skip


def test_the_openai_clients_default_base64_decodes_to_the_same_vector(served):
    handle, client = served
    name = handle.state.served_name
    packed = client.embeddings.create(model=name, input="two")  # the client asks for base64
    plain = client.embeddings.create(model=name, input="two", encoding_format="float")
    np.testing.assert_allclose(packed.data[0].embedding, plain.data[0].embedding, atol=0)


def test_embeddings_run_between_the_decode_steps_of_a_chat(served):
    handle, client = served
    name = handle.state.served_name

    def chat():
        return client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Hello"}], max_tokens=40,
            temperature=0,
        )  # fmt: skip

    with ThreadPoolExecutor(2) as pool:
        replies = [pool.submit(chat) for _ in range(2)]
        vectors = [client.embeddings.create(model=name, input=TEXTS[0]) for _ in range(3)]
        assert all(r.result().choices[0].finish_reason in ("length", "stop") for r in replies)
    want = _reference(_ids(handle, TEXTS[0]))
    for reply in vectors:
        np.testing.assert_allclose(reply.data[0].embedding, want, atol=1e-5)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": [[]]}, "input"),
        ({"input": ["a", 5]}, "input"),
        ({"input": [[1, -1]]}, "input"),
        ({"input": [[VOCAB]]}, "input"),
        ({"input": ["x"] * 2049}, "input"),
        ({"input": "\ud800"}, "input"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "dimensions": sm.DIM + 1}, "dimensions"),
        ({"input": " x" * 300}, "input"),  # past the served context
    ],
)
def test_a_bad_request_is_a_400_naming_the_field(served, body, param):
    handle, _ = served
    text = json.dumps({"model": handle.state.served_name, **body})  # "\ud800" stays escaped
    answer = httpx.post(handle.url + "/v1/embeddings", content=text, timeout=30,
                        headers={"Content-Type": "application/json"})  # fmt: skip
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


_id = st.integers(-3, VOCAB + 3) | st.sampled_from([2**31, 2**63, True, 1.5, "7"])
_input = st.recursive(
    st.text(max_size=8) | _id | st.none(),
    lambda inner: st.lists(inner, max_size=4),
    max_leaves=10,
)
_field = (
    st.none() | st.booleans() | _id | st.text(max_size=6) | st.sampled_from(["float", "base64"])
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=st.fixed_dictionaries(
    {"input": _input},
    optional={"encoding_format": _field, "dimensions": _field, "user": _field, "extra": _field},
))  # fmt: skip
def test_fuzzed_bodies_answer_200_or_a_400_never_a_500(served, body):
    handle, _ = served
    answer = httpx.post(handle.url + "/v1/embeddings", timeout=30,
                        json={"model": handle.state.served_name, **body})  # fmt: skip
    assert answer.status_code in (200, 400), answer.text
    if answer.status_code == 200:
        assert len(answer.json()["data"]) >= 1
    else:
        assert answer.json()["error"]["param"] in ("input", "encoding_format", "dimensions")


def test_an_unknown_model_is_a_404(served):
    handle, _ = served
    answer = httpx.post(handle.url + "/v1/embeddings", json={"model": "other", "input": "x"},
                        timeout=30)  # fmt: skip
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "model_not_found"


def test_mean_pooling_from_the_folders_sentence_transformers_config(tmp_path):
    folder = _folder(tmp_path, "mean", pooling={"pooling_mode_mean_tokens": True})
    handle, client = _start(folder)
    try:
        reply = client.embeddings.create(model=handle.state.served_name, input=TEXTS[0])
        want = _reference(_ids(handle, TEXTS[0]), "mean")
        np.testing.assert_allclose(reply.data[0].embedding, want, atol=1e-5)
        assert not np.allclose(want, _reference(_ids(handle, TEXTS[0])))  # mean is not last
    finally:
        handle.stop()


def test_the_pooling_config_is_found_through_modules_json(tmp_path):
    (tmp_path / "2_Pool").mkdir()
    (tmp_path / "2_Pool" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    kind = "sentence_transformers.models."
    modules = [{"idx": 0, "name": "0", "path": "", "type": kind + "Transformer"},
               {"idx": 1, "name": "1", "path": "2_Pool", "type": kind + "Pooling"}]  # fmt: skip
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    assert folder_pooling(tmp_path) == "cls"
    assert folder_pooling(tmp_path / "2_Pool") == "last"  # no config: last-token
    (tmp_path / "2_Pool" / "config.json").write_text(
        '{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": true}'
    )
    with pytest.raises(ModelError, match="exactly one"):
        folder_pooling(tmp_path)


def test_a_folder_without_hidden_states_says_why_it_cannot_embed():
    handle, _ = _start(require_shared("models", SMALL))
    try:
        body = {"model": handle.state.served_name, "input": "x"}
        answer = httpx.post(handle.url + "/v1/embeddings", json=body, timeout=30)
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["code"] == "embeddings_unsupported" and error["param"] == "model"
        assert "hidden_states" in error["message"] and "include_hidden_states" in error["message"]
    finally:
        handle.stop()
