"""Client libraries end to end against `genai-runtime serve`: each library's own calls, as an
agent developer writes them, on one served model. A library that is not installed is reported as
skipped, not failed.

    python benchmarks/client_libraries.py MODEL [--max-tokens N]

MODEL is a pulled name or a model folder (Qwen2.5-Coder-1.5B is the one the forced-call checks
were written for). Exit status 1 if any check that ran failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback


def serve(model: str) -> tuple[subprocess.Popen, str, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "genai_runtime", "serve", model, "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    line = proc.stdout.readline()
    if not line.startswith("serving "):
        raise SystemExit(f"serve did not start: {line!r}")
    return proc, line.split(" on ", 1)[1].split()[0], line.split("'")[1]


def check_openai_required(url: str, name: str, max_tokens: int) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=url, api_key="x", max_retries=0)
    tools = [
        {
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
    ]
    reply = client.chat.completions.create(
        model=name, tools=tools, tool_choice="required", temperature=0, max_tokens=max_tokens,
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


CHECKS = {
    "openai chat tool_choice=required": check_openai_required,
    "openai responses + previous_response_id": check_openai_responses,
    "langchain bind_tools(tool_choice='any')": check_langchain_any,
    "langchain with_structured_output(json_schema)": check_langchain_structured,
    "langchain OpenAI.batch (several prompts)": check_langchain_batch,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args()
    proc, url, name = serve(args.model)
    failed = 0
    try:
        for label, check in CHECKS.items():
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
