"""The request fields real clients send, through the one decoding chain: ``logit_bias``,
``presence_penalty`` / ``frequency_penalty``, and logprobs that report the model's distribution
(never a grammar's mask), with the official ``openai`` client against a real server."""

from __future__ import annotations

import math

import httpx
import pytest
from conftest import require_shared

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from genai_runtime.server import ServerHandle  # noqa: E402

SMALL = "smollm2-135m-instruct-int4-2layers"


@pytest.fixture(scope="module")
def small():
    handle = ServerHandle(str(require_shared("models", SMALL)), port=0).start()
    yield handle
    handle.stop()


def _client(handle):
    return openai.OpenAI(base_url=handle.url + "/v1", api_key="x", max_retries=0)


def _greedy(handle, **extra):
    reply = _client(handle).completions.create(
        model=handle.state.served_name, prompt="The capital of France is", max_tokens=8,
        temperature=0, logprobs=1, **extra,
    )  # fmt: skip
    return reply.choices[0]


def test_logit_bias_minus_100_on_the_greedy_first_token_changes_it(small):
    first = _greedy(small).logprobs.tokens[0]
    tokenizer = small.state.engine.tokenizer
    first_id = int(tokenizer.encode(first)[0])
    biased = _greedy(small, logit_bias={str(first_id): -100})
    assert biased.logprobs.tokens[0] != first
    assert _greedy(small, logit_bias={str(first_id): 0}).logprobs.tokens[0] == first


def test_penalties_change_a_repetitive_reply(small):
    client = _client(small)

    def text(**extra):
        return client.completions.create(
            model=small.state.served_name, prompt="one one one one one one", max_tokens=24,
            temperature=0, **extra,
        ).choices[0].text  # fmt: skip

    plain = text()
    assert text(frequency_penalty=2.0) != plain
    assert text(presence_penalty=2.0) != plain
    assert text(presence_penalty=0.0, frequency_penalty=0.0) == plain


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("logit_bias", {"999999": 5}, "logit_bias"),  # past the vocabulary
        ("logit_bias", {"12": 101}, "logit_bias"),
        ("logit_bias", {"a": 1}, "logit_bias"),
        ("presence_penalty", 2.5, "presence_penalty"),
        ("frequency_penalty", "high", "frequency_penalty"),
    ],
)
def test_bad_values_are_a_400_naming_the_field(small, field, value, param):
    body = {"model": small.state.served_name, "prompt": "Hi", "max_tokens": 2, field: value}
    reply = httpx.post(small.url + "/v1/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_logprobs_under_a_grammar_report_the_models_distribution(small):
    reply = _client(small).chat.completions.create(
        model=small.state.served_name, temperature=0, max_tokens=24, logprobs=True,
        top_logprobs=5, messages=[{"role": "user", "content": "Give me a JSON object."}],
        response_format={"type": "json_object"},
    )  # fmt: skip
    entries = reply.choices[0].logprobs.content
    assert entries
    for entry in entries:
        values = [entry.logprob, *(t.logprob for t in entry.top_logprobs)]
        assert all(math.isfinite(v) and v > -1e4 for v in values), entry
        assert len(entry.top_logprobs) == 5


def test_n_gives_n_choices_equal_under_greedy_and_apart_under_a_seeded_sample(small):
    client, name = _client(small), small.state.served_name
    ask = [{"role": "user", "content": "Tell me a story."}]
    greedy = client.chat.completions.create(model=name, messages=ask, n=2, temperature=0,
                                            max_tokens=12)  # fmt: skip
    assert [c.index for c in greedy.choices] == [0, 1]
    assert greedy.choices[0].message.content == greedy.choices[1].message.content
    one = client.chat.completions.create(model=name, messages=ask, temperature=0, max_tokens=12)
    assert greedy.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counts once
    assert greedy.usage.completion_tokens == 2 * one.usage.completion_tokens
    sampled = client.chat.completions.create(model=name, messages=ask, n=2, temperature=1.0,
                                             seed=7, max_tokens=12)  # fmt: skip
    texts = [c.message.content for c in sampled.choices]
    assert texts[0] != texts[1]
    again = client.chat.completions.create(model=name, messages=ask, n=2, temperature=1.0,
                                           seed=7, max_tokens=12)  # fmt: skip
    assert [c.message.content for c in again.choices] == texts  # seeded: reproducible


def test_several_prompts_give_a_choice_each(small):
    client, name = _client(small), small.state.served_name
    prompts = ["The capital of France is", "Once upon a time"]
    both = client.completions.create(model=name, prompt=prompts, max_tokens=6, temperature=0)
    alone = [client.completions.create(model=name, prompt=p, max_tokens=6, temperature=0)
             for p in prompts]  # fmt: skip
    assert [c.index for c in both.choices] == [0, 1]
    assert [c.text for c in both.choices] == [a.choices[0].text for a in alone]
    assert both.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)


def test_several_choices_stream_each_by_its_index_as_they_reply_whole(small):
    client, name = _client(small), small.state.served_name
    ask = [{"role": "user", "content": "Tell me a story."}]
    kw = dict(model=name, messages=ask, n=3, temperature=1.0, seed=11, max_tokens=10)
    whole = client.chat.completions.create(**kw)
    texts: dict[int, str] = {}
    finishes, usages, roles = {}, [], 0
    stream = client.chat.completions.create(**kw, stream=True,
                                            stream_options={"include_usage": True})  # fmt: skip
    for chunk in stream:
        if chunk.usage is not None:
            usages.append(chunk.usage)
        for choice in chunk.choices:
            roles += choice.delta.role == "assistant"
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert roles == 3 and sorted(texts) == [0, 1, 2]
    assert [texts[k] for k in range(3)] == [c.message.content for c in whole.choices]
    assert finishes == {c.index: c.finish_reason for c in whole.choices}
    (usage,) = usages  # one usage chunk for every choice
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_several_prompts_stream_a_choice_each(small):
    client, name = _client(small), small.state.served_name
    prompts = ["The capital of France is", "Once upon a time"]
    kw = dict(model=name, prompt=prompts, max_tokens=6, temperature=0, n=2)
    whole = client.completions.create(**kw)
    texts: dict[int, str] = {}
    for chunk in client.completions.create(**kw, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert [texts[k] for k in range(4)] == [c.text for c in whole.choices]
    too_many = {"model": name, "prompt": "Hi", "n": 17, "stream": True}
    assert httpx.post(small.url + "/v1/completions", json=too_many, timeout=60).status_code == 400
