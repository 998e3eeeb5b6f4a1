"""Does prefix reuse change greedy output? Follow-up turns on a reusing server vs a fresh prefill.

    python benchmarks/server_prefix_parity.py MODEL_DIR [--conversations 20] [--tokens 24]

Two in-process servers on 127.0.0.1: one reuses cached prefixes (the default), one never does
(``prefix_reuse=False``: every prompt is prefilled whole). Each conversation's first turn runs
on the reusing server; its second turn (the whole history, as OpenAI clients send it) then runs
on both, greedy. Prints how many second turns differ, and the prompt tokens the reuse saved.
"""

from __future__ import annotations

import argparse

import openai

from genai_runtime.server import ServerHandle

FIRST = [
    "What is the capital of France?", "Name three primary colours.", "Write a haiku about rain.",
    "What is 12 times 13?", "Who wrote Hamlet?", "Give me a synonym for happy.",
    "How many legs does a spider have?", "What is the boiling point of water?",
    "Translate 'good morning' to Spanish.", "What is photosynthesis?", "Name a prime number.",
    "Why is the sky blue?", "What does CPU stand for?", "Suggest a name for a cat.",
    "What is the largest ocean?", "How do I boil an egg?", "What is a noun?",
    "Tell me a fun fact about owls.", "What is the speed of light?", "Who painted the Mona Lisa?",
]  # fmt: skip
FOLLOW = ["Tell me more.", "Why?", "Can you say that in another way?", "And then?"]


def chat(client: openai.OpenAI, name: str, messages: list, tokens: int):
    reply = client.chat.completions.create(
        model=name, messages=messages, temperature=0, max_tokens=tokens
    )
    return reply.choices[0].message.content, reply.usage


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("--conversations", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=24)
    args = ap.parse_args()
    reuse = ServerHandle(args.model_dir, port=0, max_active=4).start()
    fresh = ServerHandle(args.model_dir, port=0, max_active=4, prefix_reuse=False).start()
    name = reuse.state.served_name
    clients = [openai.OpenAI(base_url=h.url + "/v1", api_key="x", max_retries=0)
               for h in (reuse, fresh)]  # fmt: skip
    differ, cached, prompt = 0, 0, 0
    try:
        for i in range(args.conversations):
            messages = [{"role": "user", "content": FIRST[i % len(FIRST)]}]
            first, _ = chat(clients[0], name, messages, args.tokens)
            messages += [{"role": "assistant", "content": first},
                         {"role": "user", "content": FOLLOW[i % len(FOLLOW)]}]  # fmt: skip
            again, usage = chat(clients[0], name, messages, args.tokens)
            alone, _ = chat(clients[1], name, messages, args.tokens)
            cached += usage.prompt_tokens_details.cached_tokens
            prompt += usage.prompt_tokens
            if again != alone:
                differ += 1
                print(f"conversation {i}: differs\n  reused: {again!r}\n  fresh:  {alone!r}")
    finally:
        reuse.stop()
        fresh.stop()
    print(f"{differ}/{args.conversations} second turns differ from a fresh prefill; "
          f"{cached}/{prompt} prompt tokens reused")  # fmt: skip


if __name__ == "__main__":
    main()
