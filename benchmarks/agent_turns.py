"""Agent-style conversations against the server's prompt cache: time to first token per turn.

    python benchmarks/agent_turns.py MODEL_DIR [--conversations 8] [--turns 5] [--threads 2]
        [--cold-conversations 2] [--restarts 3]

Every conversation starts with the same long system prompt and tool list (over 1,000 tokens on
Qwen2.5-Coder's tokenizer) and resends the whole history each turn, as agents do. Phases, one
in-process server at a time on 127.0.0.1 (never two at once: their threads would compete):

1. cold: no prompt cache and no prefix reuse; every turn prefills its whole prompt (the first
   ``--cold-conversations`` conversations: a cold turn costs what every turn 1 costs).
2. cached: the prompt cache on, kept in a fresh folder.
3. restart: ``--restarts`` times, a server restarted over that folder answers turn 1 of a new
   conversation (same system prompt), and a server over an empty folder answers the same turn
   cold; they alternate.

Prints the mean TTFT per turn for phases 1 and 2, the ratios (turns 2..N cached against turn 1
cold; restart against cold start), the cached tokens the server reported, and whether the greedy
replies of phases 1 and 2 are identical.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import openai

from genai_runtime.server import ServerHandle

TOOLS = [
    ("read_file", "Read a file of the repository and return its text.", {"path": "string"}),
    ("write_file", "Replace a file's text; creates folders as needed.",
     {"path": "string", "text": "string"}),
    ("apply_patch", "Apply a unified diff to the working tree; fails if a hunk does not apply.",
     {"patch": "string"}),
    ("run", "Run a shell command in the repository root and return stdout, stderr and the "
     "exit status; commands time out after 120 seconds.", {"command": "string"}),
    ("search_code", "Search the repository for a regular expression; returns file:line matches.",
     {"pattern": "string", "glob": "string"}),
    ("list_dir", "List a folder's entries with their sizes.", {"path": "string"}),
    ("run_tests", "Run pytest on the given test paths and return the summary.",
     {"paths": "array"}),
    ("git_diff", "Show the working tree's changes against HEAD.", {}),
    ("web_docs", "Look up a library's documentation page by name.", {"library": "string",
     "topic": "string"}),
    ("ask_user", "Ask the user a question when the task is ambiguous.", {"question": "string"}),
]  # fmt: skip
RULES = """You are a coding agent working in a Python repository. Work in small steps: read the
relevant files first, then change as little as possible, then run the tests that cover the
change. Call exactly one tool per reply, as JSON {"tool": NAME, "arguments": {...}}, and nothing
else; after a tool result, decide the next step. Never invent file contents: read them. Keep
functions short, name things plainly, and match the surrounding style. Do not add dependencies.
When a test fails, read its output carefully before changing code. When the task is done, reply
with a one-paragraph summary instead of a tool call. Respect the repository's layering: lower
modules never import higher ones. Errors raised to users must say what went wrong and what to do.
"""
STEPS = [
    "Task: the CLI's --max-context flag is ignored by `run`. Find where it should apply.",
    'Tool result: {"matches": ["cli/run.py:88: max_context = args.max_context", '
    '"generator.py:140: def set_search_options"]}',
    'Tool result: {"text": "def cmd_run(args):\\n    max_context = args.max_context\\n    '
    'params = GeneratorParams(model)\\n    ..."}',
    'Tool result: {"status": "applied", "files": ["cli/run.py"]}',
    'Tool result: {"passed": 41, "failed": 0, "summary": "41 passed in 12.3s"}',
    'Tool result: {"status": 0, "stdout": "ok"}',
]


def system_prompt() -> str:
    tools = [{"name": n, "description": d, "parameters": {"type": "object", "properties": {
        k: {"type": v} for k, v in p.items()}}} for n, d, p in TOOLS]  # fmt: skip
    examples = "\n".join(
        f"Example {i + 1}: to {d[0].lower() + d[1:]} call "
        + json.dumps({"tool": n, "arguments": {k: f"<{k}>" for k in p}})
        for i, (n, d, p) in enumerate(TOOLS)
    )
    return RULES * 2 + "\nTools:\n" + json.dumps(tools, indent=1) + "\n" + examples


def turn(client: openai.OpenAI, name: str, messages: list[dict], max_tokens: int) -> tuple:
    """(TTFT in seconds, reply text, cached prompt tokens, prompt tokens) of one streamed turn."""
    start = time.perf_counter()
    ttft, text, usage = None, "", None
    stream = client.chat.completions.create(
        model=name, messages=messages, temperature=0, max_tokens=max_tokens, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:  # the first token's text
            ttft = ttft or time.perf_counter() - start
            text += chunk.choices[0].delta.content
        if chunk.usage is not None:
            usage = chunk.usage
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    return ttft or time.perf_counter() - start, text, cached or 0, usage.prompt_tokens


def conversations(
    handle: ServerHandle, args, tag: str, count: int
) -> tuple[list[list[tuple]], list[str]]:
    client = openai.OpenAI(base_url=handle.url + "/v1", api_key="x", max_retries=0, timeout=600)
    system = system_prompt()
    results, replies = [], []
    for c in range(count):
        messages = [{"role": "system", "content": system}]
        rows = []
        for t in range(args.turns):
            step = STEPS[t % len(STEPS)]
            messages.append({"role": "user", "content": f"[conversation {c + 1}] {step}"})
            ttft, text, cached, prompt = turn(client, handle.state.served_name, messages,
                                              args.max_tokens)  # fmt: skip
            messages.append({"role": "assistant", "content": text})
            rows.append((ttft, cached, prompt))
            replies.append(text)
            print(f"  {tag} conversation {c + 1} turn {t + 1}: {prompt} prompt tokens, "
                  f"{cached} cached, TTFT {ttft * 1000:.0f} ms", flush=True)  # fmt: skip
        results.append(rows)
    return results, replies


def first_turn(handle: ServerHandle, args, n: int) -> tuple[float, int]:
    client = openai.OpenAI(base_url=handle.url + "/v1", api_key="x", max_retries=0, timeout=600)
    messages = [{"role": "system", "content": system_prompt()},
                {"role": "user", "content": f"[new conversation {n}] {STEPS[0]}"}]  # fmt: skip
    ttft, _, cached, _ = turn(client, handle.state.served_name, messages, args.max_tokens)
    return ttft, cached


def server(args, **options) -> ServerHandle:
    return ServerHandle(args.model_dir, port=0, max_active=args.max_active, threads=args.threads,
                        **options).start(timeout=600)  # fmt: skip


def mean_turn(results: list[list[tuple]], t: int) -> float:
    return statistics.mean(rows[t][0] for rows in results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--cold-conversations", type=int, default=2)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-active", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--restarts", type=int, default=3)
    args = ap.parse_args()

    print("phase 1: cold (no prompt cache, no prefix reuse)", flush=True)
    handle = server(args, prompt_cache_mb=0, prefix_reuse=False)
    try:
        cold, cold_replies = conversations(handle, args, "cold", args.cold_conversations)
    finally:
        handle.stop()
    folder = tempfile.mkdtemp(prefix="agent-turns-")
    print(f"phase 2: prompt cache on (kept in {folder})", flush=True)
    handle = server(args, prompt_cache_dir=folder)
    try:
        warm, warm_replies = conversations(handle, args, "cached", args.conversations)
    finally:
        handle.stop()
    restarted, started = [], []
    for i in range(args.restarts):
        print(f"phase 3, round {i + 1}: restarted over the folder, then a cold start", flush=True)
        handle = server(args, prompt_cache_dir=folder)
        try:
            restarted.append(first_turn(handle, args, i + 1))
        finally:
            handle.stop()
        handle = server(args, prompt_cache_dir=tempfile.mkdtemp(prefix="agent-turns-cold-"))
        try:
            started.append(first_turn(handle, args, i + 1))
        finally:
            handle.stop()

    print(f"\nmeans over {len(cold)} cold and {len(warm)} cached conversations")
    print("turn  prompt tokens  cold TTFT  cached TTFT  cached tokens (mean)")
    for t in range(args.turns):
        prompt = statistics.mean(rows[t][2] for rows in warm)
        hits = statistics.mean(rows[t][1] for rows in warm)
        print(f"{t + 1:4d}  {prompt:13.0f}  {mean_turn(cold, t) * 1000:6.0f} ms  "
              f"{mean_turn(warm, t) * 1000:8.0f} ms  {hits:8.0f}")  # fmt: skip
    later_warm = statistics.mean(rows[t][0] for rows in warm for t in range(1, args.turns))
    later_cold = statistics.mean(rows[t][0] for rows in cold for t in range(1, args.turns))
    first_cold = mean_turn(cold, 0)
    print(f"\nturns 2-{args.turns} cached / turn 1 cold: {later_warm / first_cold:.3f} "
          f"({later_warm * 1000:.0f} ms / {first_cold * 1000:.0f} ms)")  # fmt: skip
    print(f"turns 2-{args.turns} cached / turns 2-{args.turns} cold: "
          f"{later_warm / later_cold:.3f}")  # fmt: skip
    if len(warm) > 1:
        first_warm = statistics.mean(rows[0][0] for rows in warm[1:])
        print(f"turn 1 of conversations 2-{args.conversations} cached / turn 1 cold: "
              f"{first_warm / first_cold:.3f}")  # fmt: skip
    r = statistics.median(t for t, _ in restarted)
    s = statistics.median(t for t, _ in started)
    hits = [c for _, c in restarted]
    print(f"after a restart, turn 1 of a new conversation: {r * 1000:.0f} ms (cached tokens "
          f"{hits}) vs a cold start {s * 1000:.0f} ms: {r / s:.3f}")  # fmt: skip
    same = sum(a == b for a, b in zip(cold_replies, warm_replies))
    print(f"greedy replies identical, cache on vs off: {same} of {len(cold_replies)} (the "
          f"first {len(cold)} conversations)")  # fmt: skip


if __name__ == "__main__":
    main()
