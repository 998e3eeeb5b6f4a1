"""Client libraries end to end against `genai-runtime serve`: each library's own calls, as an
agent developer writes them, on one served model. A library that is not installed is reported as
skipped, not failed.

    python benchmarks/client_libraries.py MODEL [--max-tokens N] [--server-python PATH]
                                          [--only TEXT]

MODEL is a pulled name or a model folder (Qwen2.5-Coder-1.5B is the one the forced-call checks
were written for). The client libraries need not share the project's environment: run this script
with a separate one's Python and name the project's with ``--server-python`` (the server runs
there). ``--only`` runs the checks whose label holds TEXT. Exit status 1 if any check that ran
failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback


def serve(model: str, python: str) -> tuple[subprocess.Popen, str, str]:
    proc = subprocess.Popen(
        [python, "-m", "genai_runtime", "serve", model, "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    line = proc.stdout.readline()
    if not line.startswith("serving "):
        raise SystemExit(f"serve did not start: {line!r}")
    return proc, line.split(" on ", 1)[1].split()[0], line.split("'")[1]


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def check_openai_required(url: str, name: str, max_tokens: int) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=url, api_key="x", max_retries=0)
    reply = client.chat.completions.create(
        model=name, tools=[WEATHER_TOOL], tool_choice="required", temperature=0,
        max_tokens=max_tokens,
        messages=[{"role": "user", "content": "What's the weather like in Paris right now?"}],
    )  # fmt: skip
    choice = reply.choices[0]
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    assert choice.finish_reason == "tool_calls" and not choice.message.content, reply
    assert len(calls) == 1, calls
    return f"one call {calls[0]}, finish tool_calls"


def check_openai_responses(url: str, name: str, max_tokens: int) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=url, api_key="x", max_retries=0)
    first = client.responses.create(model=name, input="Name a colour.", temperature=0,
                                    max_output_tokens=max_tokens)  # fmt: skip
    second = client.responses.create(
        model=name,
        input="And another?",
        temperature=0,
        previous_response_id=first.id,
        max_output_tokens=max_tokens,
    )
    assert first.output_text and second.output_text
    return f"{first.output_text[:40]!r} / {second.output_text[:40]!r}"


def check_langchain_any(url: str, name: str, max_tokens: int) -> str:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return "sunny"

    llm = ChatOpenAI(base_url=url, api_key="x", model=name, temperature=0, max_tokens=max_tokens)
    message = llm.bind_tools([get_weather], tool_choice="any").invoke(
        "What's the weather like in Paris right now?"
    )
    assert len(message.tool_calls) == 1 and not message.content, message
    assert message.response_metadata.get("finish_reason") == "tool_calls", message
    return f"one call {message.tool_calls[0]['name']}({message.tool_calls[0]['args']})"


def check_langchain_structured(url: str, name: str, max_tokens: int) -> str:
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: str = Field(max_length=40)
        country: str = Field(max_length=40)

    llm = ChatOpenAI(base_url=url, api_key="x", model=name, temperature=0, max_tokens=max_tokens)
    city = llm.with_structured_output(City, method="json_schema").invoke(
        "Name the capital of France and its country."
    )
    assert isinstance(city, City), city
    return repr(city)


def check_langchain_batch(url: str, name: str, max_tokens: int) -> str:
    from langchain_openai import OpenAI

    llm = OpenAI(base_url=url, api_key="x", model=name, temperature=0, max_tokens=8)
    out = llm.batch(["The capital of France is", "One plus one is"])
    assert len(out) == 2 and all(isinstance(t, str) for t in out), out
    return repr(out)


PERSON_TEXT = "Extract: Marie Curie, aged 66, lived in Paris, France."


def _instructor(url: str, name: str, max_tokens: int, mode_name: str) -> str:
    import instructor
    from openai import OpenAI
    from pydantic import BaseModel, Field

    class Address(BaseModel):
        city: str = Field(max_length=40)
        country: str = Field(max_length=40)

    class Person(BaseModel):
        name: str = Field(max_length=40)
        age: int
        address: Address

    client = instructor.from_openai(
        OpenAI(base_url=url, api_key="x", max_retries=0), mode=getattr(instructor.Mode, mode_name)
    )
    person = client.chat.completions.create(
        model=name, response_model=Person, max_retries=0, temperature=0, max_tokens=max_tokens,
        messages=[{"role": "user", "content": PERSON_TEXT}],
    )  # fmt: skip
    assert isinstance(person, Person) and isinstance(person.address, Address), person
    return repr(person)


def check_instructor_json_schema(url: str, name: str, max_tokens: int) -> str:
    return _instructor(url, name, max_tokens, "JSON_SCHEMA")


def check_instructor_tools(url: str, name: str, max_tokens: int) -> str:
    return _instructor(url, name, max_tokens, "TOOLS")


def check_agents_sdk(url: str, name: str, max_tokens: int) -> str:
    import asyncio

    from agents import (
        Agent,
        ModelSettings,
        Runner,
        function_tool,
        set_default_openai_api,
        set_default_openai_client,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        calls.append(city)
        return f"The weather in {city} is sunny, 21 C."

    async def run() -> object:
        # the SDK's default model path: the default client, the Responses API, no tracing upload
        set_default_openai_client(AsyncOpenAI(base_url=url, api_key="x", max_retries=0), False)
        set_default_openai_api("responses")
        set_tracing_disabled(True)
        agent = Agent(
            name="weather", model=name, tools=[get_weather],
            # Qwen2.5-Coder-1.5B calls the tool again after its result unless told what then
            instructions="You are a weather assistant. When a tool response gives the weather, "
            "tell the user in plain words.",
            model_settings=ModelSettings(temperature=0, max_tokens=max_tokens),
        )  # fmt: skip
        return await Runner.run(agent, "What's the weather like in Paris right now?", max_turns=4)

    result = asyncio.run(run())
    kinds = [item.type for item in result.new_items]
    assert calls and "tool_call_item" in kinds and "tool_call_output_item" in kinds, kinds
    assert isinstance(result.final_output, str) and result.final_output.strip(), result
    return f"tool get_weather({calls[0]!r}), final {result.final_output.strip()[:60]!r}"


def _litellm(url: str, name: str, max_tokens: int, **extra: object) -> object:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch from GitHub
    import litellm

    return litellm.completion(
        model=f"openai/{name}", api_base=url, api_key="x", temperature=0, max_tokens=max_tokens,
        num_retries=0, messages=[{"role": "user", "content": extra.pop("prompt")}], **extra,
    )  # fmt: skip


def check_litellm_plain(url: str, name: str, max_tokens: int) -> str:
    reply = _litellm(url, name, max_tokens, prompt="Name the capital of France in one word.")
    text = reply.choices[0].message.content
    assert text and reply.usage.completion_tokens > 0, reply
    return f"{text.strip()[:40]!r}, finish {reply.choices[0].finish_reason}"


def check_litellm_required(url: str, name: str, max_tokens: int) -> str:
    reply = _litellm(
        url, name, max_tokens, prompt="What's the weather like in Paris right now?",
        tools=[WEATHER_TOOL], tool_choice="required",
    )  # fmt: skip
    choice = reply.choices[0]
    calls = choice.message.tool_calls or []
    assert choice.finish_reason == "tool_calls" and not choice.message.content, reply
    assert len(calls) == 1, calls
    return f"one call {calls[0].function.name}({calls[0].function.arguments})"


CHECKS = {
    "openai chat tool_choice=required": check_openai_required,
    "openai responses + previous_response_id": check_openai_responses,
    "langchain bind_tools(tool_choice='any')": check_langchain_any,
    "langchain with_structured_output(json_schema)": check_langchain_structured,
    "langchain OpenAI.batch (several prompts)": check_langchain_batch,
    "instructor Mode.JSON_SCHEMA (nested model)": check_instructor_json_schema,
    "instructor Mode.TOOLS (nested model)": check_instructor_tools,
    "agents SDK default model (responses) + tool": check_agents_sdk,
    "litellm completion (openai/ api_base)": check_litellm_plain,
    "litellm completion tool_choice=required": check_litellm_required,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument(
        "--server-python",
        default=sys.executable,
        help="the Python (with genai_runtime installed) that runs the server",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="run only the checks whose label contains this text (repeatable)",
    )
    args = parser.parse_args()
    proc, url, name = serve(args.model, args.server_python)
    failed = 0
    try:
        for label, check in CHECKS.items():
            if args.only and not any(part in label for part in args.only):
                continue
            start = time.monotonic()
            try:
                result = f"ok    {check(url, name, args.max_tokens)}"
            except ImportError as exc:
                result = f"skip  not installed: {exc.name}"
            except Exception:
                failed += 1
                result = "FAIL  " + traceback.format_exc(limit=2).strip().splitlines()[-1]
            print(f"{label:48s} {time.monotonic() - start:5.1f} s  {result}", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
