"""A script for onnxruntime-genai 0.18's Engine API, written for the reference and nothing else.

Two conversations share one Engine: A asks a question, B is submitted while A is answering; A
asks a follow-up as soon as its first turn ends; B's first turn is cancelled after six tokens and
B starts a second turn; then C and D decode together, C up to a small session limit, D to its
end of sequence. Every event is recorded; the script prints them as JSON (tokens, finish
reasons, usage per request and turn).

``benchmarks/engine_api_parity.py`` runs it unchanged on the reference and on genai_runtime (an
import shim binds ``onnxruntime_genai`` to genai_runtime) and compares the two.

    python benchmarks/engine_api_script.py ../shared/models/smollm2-135m-instruct-int4
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import onnxruntime_genai as og


def main(model_dir: str) -> None:
    model = og.Model(model_dir)
    tokenizer = og.Tokenizer(model)
    engine = og.Engine(model)

    def chat(text: str) -> np.ndarray:
        messages = json.dumps([{"role": "user", "content": text}])
        prompt = tokenizer.apply_chat_template(messages=messages, add_generation_prompt=True)
        return np.asarray(tokenizer.encode(prompt), dtype=np.int32)

    def follow_up(text: str) -> np.ndarray:
        turn = f"<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
        return np.asarray(tokenizer.encode(turn), dtype=np.int32)

    def request(max_session_tokens: int) -> og.Request:
        options = og.RequestOptions()
        options.set_max_session_tokens(max_session_tokens)
        return engine.create_request(options=options)

    def limit(req: og.Request, max_tokens: int) -> og.TurnOptions:
        options = og.TurnOptions(req)
        options.set_max_generated_tokens(max_tokens)
        return options

    a, b, c, d = request(512), request(512), request(60), request(512)
    names = {id(a): "A", id(b): "B", id(c): "C", id(d): "D"}
    log: dict[str, dict] = {}
    started = time.perf_counter()

    def record(event) -> tuple[str, dict]:
        name = names[id(event.request)]
        turn = log.setdefault(f"{name}{event.turn_id}", {"tokens": []})
        if event.flags & og.EngineEventFlags.TOKEN:
            turn["tokens"].append(int(event.token))
        if event.flags & og.EngineEventFlags.TURN_FINISHED:
            turn["finish_reason"] = event.finish_reason.name
            usage = event.usage
            turn["usage"] = [
                usage.prompt_tokens,
                usage.generated_tokens,
                usage.cached_prompt_tokens,
            ]
        return name, turn

    a.begin_turn(chat("What is the capital of France?"), limit(a, 40))
    buffer = engine.create_event_buffer(8)
    b_begun = phase_two = False
    while engine.has_pending_requests():
        for event in engine.run(buffer):
            name, turn = record(event)
            finished = bool(event.flags & og.EngineEventFlags.TURN_FINISHED)
            if name == "A" and not b_begun:  # B arrives while A is answering
                b.begin_turn(chat("Write a short poem about the sea."), limit(b, 48))
                b_begun = True
            if name == "A" and finished and event.turn_id == 1:
                a.begin_turn(follow_up("And what is the capital of Germany?"), limit(a, 24))
            if name == "B" and event.turn_id == 1 and len(turn["tokens"]) == 6 and not finished:
                assert b.cancel_turn(1) and not b.cancel_turn(1)
            if name == "B" and finished and event.turn_id == 1:
                b.begin_turn(follow_up("Just name one sea creature."), limit(b, 24))
            if name == "B" and finished and event.turn_id == 2 and not phase_two:
                phase_two = True  # two requests begun together decode as one batch
                c.begin_turn(chat("Tell me a long story about a dragon."))
                d.begin_turn(chat("Reply with one word: yes or no. Is the sky blue?"), limit(d, 32))
    seconds = time.perf_counter() - started
    for req in (a, b, c, d):
        req.close()
    json.dump({"turns": log, "engine_seconds": round(seconds, 3)}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/models/smollm2-135m-instruct-int4")
