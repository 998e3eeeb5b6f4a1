"""``POST /v1/responses`` through the official ``openai`` client: plain and streamed replies,
``previous_response_id``, and a function-tool loop (call, output, answer), as an agent runs it."""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import require_shared

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from genai_runtime.server import ServerHandle  # noqa: E402

FULL = "smollm2-135m-instruct-int4"
WEATHER = {
    "type": "function", "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"]},
}  # fmt: skip


@pytest.fixture(scope="module")
def served():
    handle = ServerHandle(str(require_shared("models", FULL)), port=0).start()
    yield handle, openai.OpenAI(base_url=handle.url + "/v1", api_key="x", max_retries=0)
    handle.stop()


def test_a_response_equals_the_chat_reply_to_the_same_messages(served):
    handle, client = served
    name = handle.state.served_name
    reply = client.responses.create(model=name, input="What is the capital of France?",
                                    temperature=0, max_output_tokens=24)  # fmt: skip
    chat = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0, max_tokens=24,
    )  # fmt: skip
    assert reply.id.startswith("resp_") and reply.object == "response"
    assert reply.output_text == chat.choices[0].message.content
    assert reply.output[0].type == "message" and reply.output[0].content[0].type == "output_text"
    assert reply.usage.input_tokens == chat.usage.prompt_tokens
    assert reply.usage.output_tokens == chat.usage.completion_tokens
    assert reply.status == ("incomplete" if chat.choices[0].finish_reason == "length" else
                            "completed")  # fmt: skip


def test_streamed_events_build_the_same_response(served):
    handle, client = served
    name = handle.state.served_name
    request = dict(model=name, input="Say hello.", instructions="Answer briefly.",
                   temperature=0, max_output_tokens=200)  # fmt: skip
    plain = client.responses.create(**request)
    kinds, deltas = [], []
    with client.responses.stream(**request) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "".join(deltas) == final.output_text == plain.output_text


def test_previous_response_id_continues_the_conversation(served):
    handle, client = served
    name = handle.state.served_name
    first = client.responses.create(model=name, input="My name is Ada.", temperature=0,
                                    max_output_tokens=16)  # fmt: skip
    second = client.responses.create(
        model=name,
        input="What is my name?",
        temperature=0,
        previous_response_id=first.id,
        max_output_tokens=16,
    )
    alone = client.responses.create(model=name, input="What is my name?", temperature=0,
                                    max_output_tokens=16)  # fmt: skip
    # the earlier turn and its reply are in the prompt
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    missing = httpx.post(handle.url + "/v1/responses", timeout=60, json={
        "model": name, "input": "Hi", "previous_response_id": "resp_unknown"})  # fmt: skip
    assert missing.status_code == 400
    assert missing.json()["error"]["param"] == "previous_response_id"


def test_a_function_tool_loop(served):
    handle, client = served
    name = handle.state.served_name
    asked = client.responses.create(
        model=name, input="What's the weather in Paris?", tools=[WEATHER], tool_choice="required",
        temperature=0, max_output_tokens=64,
    )  # fmt: skip
    calls = [item for item in asked.output if item.type == "function_call"]
    assert len(calls) >= 1 and calls[0].name == "get_weather"
    assert "city" in json.loads(calls[0].arguments) and calls[0].call_id.startswith("call_")
    result = {"type": "function_call_output", "call_id": calls[0].call_id,
              "output": json.dumps({"sky": "sunny", "temperature": 21})}  # fmt: skip
    answer = client.responses.create(
        model=name,
        previous_response_id=asked.id,
        input=[result],
        tools=[WEATHER],
        temperature=0,
        max_output_tokens=32,
    )
    assert answer.output_text and not [i for i in answer.output if i.type == "function_call"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": 5}, "input"),
        ({"input": [{"type": "image_generation_call"}]}, "input[0].type"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_the_field(served, body, param):
    handle, _ = served
    reply = httpx.post(handle.url + "/v1/responses", timeout=60,
                       json={"model": handle.state.served_name, **body})  # fmt: skip
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text
