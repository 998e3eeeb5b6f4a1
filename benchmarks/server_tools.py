"""Tool calls forced by tool_choice, sampled over many seeds: are they all calls the schema accepts,
and do streamed replies reassemble to the plain ones?

    python benchmarks/server_tools.py MODEL_DIR [--seeds 20] [--temperature 1.0] [--top-k 50]
        [--max-tokens 128] [--templates model,tagged] [--loop-choice required]
        [--final-choice auto] [--system TEXT]

For each chat template (``model``: the folder's own; ``tagged``: the tests' template that takes
tools with ``<tool_call>`` tags, put on a copy of the folder) and each choice (``required``, a
named function), every seed's request runs plain and streamed on an in-process server. Prints
per row: replies that are a call, calls whose arguments the function's JSON schema accepts,
replies cut by max_tokens (still inside a free-text string), streamed replies equal to the
plain ones (content, names, arguments, finish reason), and the median completion tokens. First,
one agent loop (call, tool result, answer) per template, greedy.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tool_templates import TAGGED, model_with_template

from genai_runtime.server import ServerHandle

WEATHER_ARGS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TIME_ARGS = {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}
SCHEMAS = {"get_weather": WEATHER_ARGS, "get_time": TIME_ARGS}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather",
     "description": "Get the current weather in a city", "parameters": WEATHER_ARGS}},
    {"type": "function", "function": {"name": "get_time",
     "description": "Get the time in a time zone", "parameters": TIME_ARGS}},
]  # fmt: skip
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def plain(client, request) -> tuple:
    reply = client.chat.completions.create(**request)
    message = reply.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]
    return message.content, calls, reply.choices[0].finish_reason, reply.usage.completion_tokens


def streamed(client, request) -> tuple:
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **request):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for d in choice.delta.tool_calls or ():
            name, args = calls.get(d.index, ("", ""))
            fn = d.function
            calls[d.index] = (name + (fn.name or "" if fn else ""),
                              args + (fn.arguments or "" if fn else ""))  # fmt: skip
        finish = choice.finish_reason or finish
    return content or None, [calls[k] for k in sorted(calls)], finish


def row(client, name: str, choice, args) -> str:
    def run(seed: int):
        request = dict(model=name, messages=QUESTION, tools=TOOLS, tool_choice=choice,
                       temperature=args.temperature, seed=seed, max_tokens=args.max_tokens,
                       extra_body={"top_k": args.top_k})  # fmt: skip
        return plain(client, request), streamed(client, request)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, range(args.seeds)))
    replies = calls = valid = cut = same = 0
    for (content, found, finish, _), again in results:
        replies += bool(found)
        calls += len(found)
        cut += finish == "length"
        same += (content, found, finish) == again
        for fn, arguments in found:
            try:
                jsonschema.validate(json.loads(arguments), SCHEMAS[fn])
                valid += 1
            except (ValueError, jsonschema.ValidationError):
                pass
    tokens = statistics.median(r[0][3] for r in results)
    shown = choice if isinstance(choice, str) else "named"
    return (f"  {shown:9s} replies with calls {replies}/{args.seeds}  valid calls {valid}/{calls}"
            f"  cut by max_tokens {cut}  stream=plain {same}/{args.seeds}  median tokens "
            f"{tokens:g}")  # fmt: skip


def agent_loop(client, name: str, first_choice: str, final_choice: str, system: str) -> str:
    question = [{"role": "system", "content": system}, *QUESTION] if system else QUESTION
    request = dict(model=name, messages=question, tools=TOOLS[:1], tool_choice=first_choice,
                   temperature=0, max_tokens=64)  # fmt: skip
    reply = client.chat.completions.create(**request)
    if not reply.choices[0].message.tool_calls:
        return f"  agent loop: no call under {first_choice}: {reply.choices[0].message.content!r}"
    call = reply.choices[0].message.tool_calls[0]
    history = [*question, reply.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id,
                "content": '{"temperature": 21, "unit": "celsius", "sky": "sunny"}'}]  # fmt: skip
    final = client.chat.completions.create(
        model=name,
        messages=history,
        tools=TOOLS[:1],
        tool_choice=final_choice,
        temperature=0,
        max_tokens=40,
    )
    answer = final.choices[0].message
    return (f"  agent loop ({first_choice}, then {final_choice}): {call.function.name}"
            f"({call.function.arguments}) -> "
            f"{answer.content!r} (calls again: {bool(answer.tool_calls)})")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--templates", default="model,tagged")
    ap.add_argument("--loop-choice", default="required", help="turn 1 of the agent loop")
    ap.add_argument("--final-choice", default="auto", help="turn 2 (after the tool's result)")
    ap.add_argument("--system", default="", help="a system message for the agent loop")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp())
    try:
        for template in args.templates.split(","):
            folder = Path(args.model_dir)
            if template == "tagged":
                folder = model_with_template(folder, scratch / f"{folder.name}-tagged", TAGGED)
            handle = ServerHandle(str(folder), port=0, max_active=4, max_queued=64).start()
            client = openai.OpenAI(base_url=handle.url + "/v1", api_key="x", max_retries=0)
            try:
                print(f"{template} template (temperature {args.temperature:g}, top_k "
                      f"{args.top_k}, max_tokens {args.max_tokens}):")  # fmt: skip
                name = handle.state.served_name
                loop = agent_loop(client, name, args.loop_choice, args.final_choice, args.system)
                print(loop, flush=True)
                for choice in ("required", NAMED) if args.seeds else ():
                    print(row(client, name, choice, args), flush=True)
            finally:
                handle.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
