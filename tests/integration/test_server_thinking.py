"""A reasoning model's thinking budget, and grammars that start after the thinking, through the
OpenAI server with the official client and, below it, ``ThinkGate`` driven token by token over
the real tokenizer and a real llguidance grammar.

The model is the 2-layer SmolLM2 behind the Qwen3-style template of ``test_server_reasoning``
(its generation prompt opens a ``<think>`` block, so a reply starts in the thinking; with
``enable_thinking`` false it closes an empty one). The tags are three tokens each in SmolLM2's
vocabulary (``</``, ``think``, ``>``), so forcing a tag is forcing a sequence. These weights
never close a block by themselves: every thinking that ends here was ended by the budget."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import require_shared

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tool_templates import THINKING, model_with_template

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
pytest.importorskip("llguidance")

import genai_runtime as og  # noqa: E402
from genai_runtime.decoding.guidance import Grammar  # noqa: E402
from genai_runtime.server import ServerHandle  # noqa: E402
from genai_runtime.server.think_gate import ThinkGate  # noqa: E402

SMALL = "smollm2-135m-instruct-int4-2layers"
ASK = [{"role": "user", "content": "What is two plus two?"}]
CLOSE = ["</", "think", ">"]
ANSWER = {
    "type": "object",
    "properties": {"answer": {"enum": ["four", "five"]}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
}
CLOSED = {
    "type": "object",
    "properties": {"a": {"type": "boolean"}},
    "required": ["a"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "London"]}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = model_with_template(
        require_shared("models", SMALL), tmp_path_factory.mktemp("think") / "thinker", THINKING
    )
    handle = ServerHandle(str(folder), port=0).start()
    yield handle, openai.OpenAI(base_url=handle.url + "/v1", api_key="x", max_retries=0)
    handle.stop()


def _ask(served, max_tokens=24, **extra):
    handle, client = served
    return client.chat.completions.create(
        model=handle.state.served_name, messages=ASK, temperature=0, max_tokens=max_tokens,
        **extra,
    )  # fmt: skip


def _tokens(reply) -> list[str]:
    return [t.token for t in reply.choices[0].logprobs.content]


def _reasoning(message) -> str:
    return (message.model_extra or {}).get("reasoning_content") or ""


@pytest.mark.parametrize("budget", [0, 1, 5])
def test_a_budget_of_n_stops_thinking_at_n_tokens_then_the_answer_goes_on(served, budget):
    free = _ask(served, logprobs=True)
    assert CLOSE[0] not in _tokens(free)  # left alone, these weights think to max_tokens
    reply = _ask(served, logprobs=True, extra_body={"thinking_token_budget": budget})
    tokens = _tokens(reply)
    assert tokens[:budget] == _tokens(free)[:budget]  # the thinking itself is the model's
    assert tokens[budget : budget + 3] == CLOSE  # then the close tag, forced
    assert len(tokens) == 24 and reply.choices[0].finish_reason == "length"  # the answer went on
    assert _reasoning(reply.choices[0].message) == "".join(tokens[:budget])


@pytest.mark.parametrize(
    "extra",
    [
        {"thinking_budget_tokens": 4},  # llama.cpp's server
        {"thinking_budget": 4},  # Qwen's API
        {"reasoning": {"max_tokens": 4}},  # OpenRouter's object
        {"thinking_token_budget": 4, "reasoning": {"max_tokens": 4, "effort": "high"}},
    ],
)
def test_every_spelling_of_the_budget_is_the_same_budget(served, extra):
    want = _tokens(_ask(served, logprobs=True, extra_body={"thinking_token_budget": 4}))
    assert _tokens(_ask(served, logprobs=True, extra_body=extra)) == want
    assert want[4:7] == CLOSE


def test_minus_one_is_no_budget_and_a_closed_prompt_has_nothing_to_bound(served):
    free = _tokens(_ask(served, logprobs=True))
    assert _tokens(_ask(served, logprobs=True, extra_body={"thinking_token_budget": -1})) == free
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    plain = _ask(served, logprobs=True, extra_body=off)
    bounded = _ask(served, logprobs=True, extra_body={**off, "thinking_token_budget": 2})
    assert _tokens(bounded) == _tokens(plain)


def test_a_streamed_reply_keeps_the_same_budget(served):
    handle, client = served
    plain = _ask(served, extra_body={"thinking_token_budget": 3}).choices[0].message
    reasoning, content = "", ""
    stream = client.chat.completions.create(
        model=handle.state.served_name, messages=ASK, temperature=0, max_tokens=24, stream=True,
        extra_body={"thinking_token_budget": 3},
    )  # fmt: skip
    for chunk in stream:
        if chunk.choices:
            reasoning += _reasoning(chunk.choices[0].delta)
            content += chunk.choices[0].delta.content or ""
    assert reasoning == _reasoning(plain) and reasoning
    assert content == (plain.content or "")


def test_a_json_schema_constrains_the_answer_only(served):
    budget = {"thinking_token_budget": 6}
    free = _ask(served, max_tokens=60, logprobs=True, extra_body=budget)
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER, "strict": True}}
    reply = _ask(served, max_tokens=60, logprobs=True, response_format=fmt, extra_body=budget)
    tokens = _tokens(reply)
    # The thinking is what the model thinks unconstrained (text no JSON schema allows) ...
    assert tokens[:9] == _tokens(free)[:9] and tokens[6:9] == CLOSE
    message = reply.choices[0].message
    assert _reasoning(message) == _reasoning(free.choices[0].message)
    assert not _reasoning(message).lstrip().startswith("{")
    # ... and the answer after it satisfies the schema, ending the reply.
    assert set(json.loads(message.content)) == {"answer", "sure"}
    assert reply.choices[0].finish_reason == "stop"


def test_without_a_budget_the_grammar_waits_for_a_close_that_never_comes(served):
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}
    reply = _ask(served, response_format=fmt, logprobs=True)
    assert _tokens(reply) == _tokens(_ask(served, logprobs=True))  # unconstrained thinking
    assert reply.choices[0].finish_reason == "length" and not reply.choices[0].message.content


def test_a_forced_tool_call_comes_after_the_thinking(served):
    budget = {"thinking_token_budget": 5}
    kw = dict(tools=[WEATHER], max_tokens=60, parallel_tool_calls=False, extra_body=budget)
    free = _ask(served, **kw)
    forced = _ask(served, tool_choice="required", **kw)
    message = forced.choices[0].message
    assert _reasoning(message) == _reasoning(free.choices[0].message) != ""
    assert forced.choices[0].finish_reason == "tool_calls"
    assert not message.content
    (call,) = message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "London")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"thinking_token_budget": -2}, "thinking_token_budget"),
        ({"thinking_token_budget": 1.5}, "thinking_token_budget"),
        ({"thinking_budget_tokens": True}, "thinking_budget_tokens"),
        ({"thinking_budget": "8"}, "thinking_budget"),
        ({"reasoning": {"max_tokens": -5}}, "reasoning.max_tokens"),
        ({"reasoning": "high"}, "reasoning"),
        ({"thinking_token_budget": 4, "thinking_budget": 8}, "thinking_budget"),
        ({"reasoning_effort": "low", "reasoning": {"effort": "high"}}, "reasoning.effort"),
    ],
)
def test_a_bad_or_contradicting_budget_is_a_400_naming_it(served, extra, param):
    handle, _ = served
    body = {"model": handle.state.served_name, "messages": ASK, "max_tokens": 4, **extra}
    answer = httpx.post(handle.url + "/v1/chat/completions", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


# -- ThinkGate token by token ---------------------------------------------------------------


@pytest.fixture(scope="module")
def parts():
    folder = require_shared("models", SMALL)
    model = og.Model(str(folder))
    return og.Tokenizer(model), folder / "tokenizer.json", model.vocab_size


def _grammar(parts, schema):
    _, tokenizer_json, vocab = parts
    return Grammar("json_schema", schema, tokenizer_json=tokenizer_json, vocab_size=vocab,
                   eos_token_ids=[2], batch_size=1)  # fmt: skip


def _drive(gate, tokenizer, vocab, wishes, steps=40):
    """Run ``gate`` over ``steps`` picks: each step's logits favour the wished token (else
    every token scores 0), the argmax is taken, as greedy decoding does."""
    history = [1, 1, 1]
    picked = []
    for step in range(steps):
        logits = np.zeros((1, vocab), np.float32)
        if step < len(wishes) and wishes[step] is not None:
            logits[0, wishes[step]] = 5.0
        out = gate(np.array([history]), logits)
        token = int(np.argmax(out[0]))
        picked.append(token)
        history.append(token)
        if token == 2:
            break
    return picked


def test_the_gate_opens_a_block_forces_the_tag_bounds_it_then_applies_the_grammar(parts):
    tokenizer, _, vocab = parts
    lt, x = int(tokenizer.encode("<")[0]), int(tokenizer.encode(" x")[0])
    gate = ThinkGate(tokenizer, "<|im_start|>assistant\n", 3, budget=2,
                     grammar=_grammar(parts, {"type": "boolean"}), eos=[2])  # fmt: skip
    # The first token may open a block though the grammar bans "<"; then "think>" is forced
    # whatever the model wants, two tokens of any text (a "<" too), the close tag, the answer.
    picked = _drive(gate, tokenizer, vocab, [lt, x, x, x, lt, lt, lt, lt, lt])
    assert picked[-1] == 2  # EOS, once the grammar is complete
    text = tokenizer.decode(picked[:-1])
    assert text.startswith("<think> x<</think>")
    assert json.loads(text.removeprefix("<think> x<</think>")) in (True, False)
    assert gate.thought == 2 and gate.mode == "answer"


def test_a_first_token_the_grammar_allows_means_no_thinking(parts):
    tokenizer, _, vocab = parts
    brace = int(tokenizer.encode('{"')[0])  # one token, the only start the grammar allows
    gate = ThinkGate(tokenizer, "<|im_start|>assistant\n", 3, budget=None,
                     grammar=_grammar(parts, CLOSED), eos=[2])  # fmt: skip
    picked = _drive(gate, tokenizer, vocab, [brace])
    assert gate.mode == "answer" and gate.thought == 0
    assert picked[-1] == 2 and set(json.loads(tokenizer.decode(picked[:-1]))) == {"a"}


def test_a_prompt_that_closed_its_block_starts_in_the_answer(parts):
    tokenizer, _, vocab = parts
    lt = int(tokenizer.encode("<")[0])
    prompt = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    gate = ThinkGate(tokenizer, prompt, 3, budget=0,
                     grammar=_grammar(parts, {"type": "boolean"}), eos=[2])  # fmt: skip
    picked = _drive(gate, tokenizer, vocab, [lt])  # "<" is not JSON: masked from the start
    assert picked[0] != lt and json.loads(tokenizer.decode(picked[:-1])) in (True, False)


def test_the_responses_api_passes_reasoning_effort_and_the_budget_on(served):
    handle, client = served
    tok = handle.state.engine.tokenizer
    off = len(tok.encode_chat(ASK, template_kwargs={"enable_thinking": False}))
    name, text = handle.state.served_name, ASK[0]["content"]
    plain = client.responses.create(model=name, input=text, max_output_tokens=8, temperature=0)
    assert plain.usage.input_tokens == len(tok.encode_chat(ASK)) and not plain.output_text
    quiet = client.responses.create(model=name, input=text, max_output_tokens=8, temperature=0,
                                    reasoning={"effort": "none"})  # fmt: skip
    assert quiet.usage.input_tokens == off
    fmt = {"format": {"type": "json_schema", "name": "a", "schema": ANSWER, "strict": True}}
    budget = {"thinking_token_budget": 3}
    bounded = client.responses.create(model=name, input=text, max_output_tokens=60, text=fmt,
                                      temperature=0, extra_body=budget)  # fmt: skip
    assert set(json.loads(bounded.output_text)) == {"answer", "sure"}
    assert bounded.status == "completed"
