"""Time to first token on a multi-turn chat, with and without prefix reuse.

    python benchmarks/server_prefix.py MODEL_DIR [--turns 6] [--rounds 3]

Two in-process servers on 127.0.0.1 (one with prefix reuse, one without) get the same
conversation (a long system prompt, then turns that each resend the whole history, as OpenAI
clients do); rounds alternate between them. Prints the median TTFT per turn and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import openai

from genai_runtime.server import ServerHandle

SYSTEM = (
    "You are a careful assistant for a hardware shop. Answer in one short sentence. "
    "Opening hours are 9 to 5, Monday to Saturday. We sell tools, paint, timber and garden "
    "supplies; deliveries within 20 km are free for orders over 50 euros. "
) * 3
QUESTIONS = ["Do you sell paint?", "When do you open?", "Is delivery free?", "Any timber?",
             "Open on Sunday?", "Do you have garden hoses?", "Can I pay by card?"]  # fmt: skip


def turn_ttfts(client: openai.OpenAI, name: str, turns: int) -> list[float]:
    messages = [{"role": "system", "content": SYSTEM}]
    out = []
    for q in QUESTIONS[:turns]:
        messages.append({"role": "user", "content": q})
        start = time.perf_counter()
        ttft, text = None, ""
        stream = client.chat.completions.create(
            model=name, messages=messages, temperature=0, max_tokens=16, stream=True
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                ttft = ttft or time.perf_counter() - start
                text += chunk.choices[0].delta.content
        out.append(ttft or time.perf_counter() - start)
        messages.append({"role": "assistant", "content": text})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    servers = {
        "reuse": ServerHandle(args.model_dir, port=0, max_active=1).start(),
        "no reuse": ServerHandle(args.model_dir, port=0, max_active=1, prefix_reuse=False).start(),
    }
    try:
        times: dict[str, list[list[float]]] = {k: [] for k in servers}
        for _ in range(args.rounds):
            for key, handle in servers.items():
                client = openai.OpenAI(base_url=handle.url + "/v1", api_key="x", max_retries=0)
                times[key].append(turn_ttfts(client, handle.state.served_name, args.turns))
        print("turn  TTFT reuse  TTFT no-reuse  ratio")
        for t in range(args.turns):
            a = statistics.median(r[t] for r in times["reuse"]) * 1000
            b = statistics.median(r[t] for r in times["no reuse"]) * 1000
            print(f"{t + 1:4d}  {a:8.0f} ms  {b:10.0f} ms  {b / a:5.2f}x")
    finally:
        for handle in servers.values():
            handle.stop()


if __name__ == "__main__":
    main()
