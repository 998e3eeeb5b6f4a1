"""Runs inside a loopback-only namespace (test_ray_cluster.py starts it): a real Ray cluster,
a Serve deployment and Ray Data batch inference; prints one JSON report.

    python tests/ray_cluster_check.py MODEL_DIR

1. Ray starts with 2 CPUs; ``build_deployment`` + ``deploy`` run 2 replicas x 1 thread.
2. 8 concurrent greedy requests, chat and completions, streamed and not, go to the deployment
   and to one in-process ``OpenAIServer`` (the same class, on uvicorn, 1 thread).
3. Serve shuts down; ``generate_dataset`` runs 2 actors, batches of 4, over 8 prompts and one
   over the context, against the same predictor called in this process.
(benchmarks/ray_scaleout.py covers the CLI, Ray Data's HTTP processor and a killed replica.)
"""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import uvicorn

from genai_runtime.integrations.loopback import require_only_loopback
from genai_runtime.integrations.ray import (
    BatchPredictor,
    OpenAIServer,
    build_deployment,
    deploy,
    generate_dataset,
)
from genai_runtime.server.app import create_app

PROMPTS = ["Name a colour.", "Tell me a joke.", "What is 2 + 2?", "Say hello.",
           "Name a fruit.", "Count to three.", "Describe rain.", "Name a planet."]  # fmt: skip


def local_server(model_dir: str) -> tuple[str, uvicorn.Server]:
    """The replica class outside Ray: one process, one thread, on port 0."""
    replica = OpenAIServer(model_dir, threads=1)
    server = uvicorn.Server(uvicorn.Config(create_app(replica.state), port=0, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    return f"http://127.0.0.1:{port}", server


def ask(url: str, name: str, i: int) -> list:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    common = dict(model=name, temperature=0, max_tokens=12)
    stream = i % 2 == 1
    if i % 4 < 2:  # chat
        messages = [{"role": "user", "content": PROMPTS[i]}]
        if not stream:
            r = client.chat.completions.create(messages=messages, **common)
            return [r.choices[0].message.content, r.choices[0].finish_reason]
        chunks = list(client.chat.completions.create(messages=messages, stream=True, **common))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return [text, chunks[-1].choices[0].finish_reason]
    if not stream:
        r = client.completions.create(prompt=PROMPTS[i], **common)
        return [r.choices[0].text, r.choices[0].finish_reason]
    chunks = list(client.completions.create(prompt=PROMPTS[i], stream=True, **common))
    return ["".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason]


def main() -> None:
    require_only_loopback()
    import ray
    from ray import serve

    model_dir = sys.argv[1]
    name = Path(model_dir).resolve().name
    report: dict = {"seconds": {}}
    t0 = time.perf_counter()

    def mark(phase: str) -> None:
        report["seconds"][phase] = round(time.perf_counter() - t0, 1)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        mark("ray_init")
        url = deploy(build_deployment(model_dir, num_replicas=2, threads=1), port=8000)
        mark("deployed")
        local_url, local = local_server(model_dir)
        with ThreadPoolExecutor(8) as pool:
            report["serve"] = list(pool.map(lambda i: ask(url, name, i), range(8)))
            report["local"] = list(pool.map(lambda i: ask(local_url, name, i), range(8)))
        local.should_exit = True
        serve.shutdown()
        mark("requests")

        ray.data.DataContext.get_current().execution_options.preserve_order = True
        items = [{"prompt": p, "max_tokens": 4 + i % 5, "row": i} for i, p in enumerate(PROMPTS)]
        items.insert(5, {"prompt": "word " * 80, "max_tokens": 4, "row": 99})  # over 64 tokens
        options = {"max_context": 64}
        ds = generate_dataset(ray.data.from_items(items), model_dir, actors=2, batch_size=4,
                              threads=1, **options)  # fmt: skip
        report["data"] = [
            [r["row"], r["generated_text"], int(r["num_tokens"]), r["finish_reason"], r["error"]]
            for r in ds.take_all()
        ]
        mark("map_batches")
        predictor = BatchPredictor(model_dir, rows=4, threads=1, **options)
        expected = []
        for start in range(0, len(items), 4):
            chunk = items[start : start + 4]
            out = predictor({k: np.array([it[k] for it in chunk], dtype=object) for k in chunk[0]})
            expected += [
                [int(out["row"][j]), out["generated_text"][j], int(out["num_tokens"][j]),
                 out["finish_reason"][j], out["error"][j]]
                for j in range(len(chunk))
            ]  # fmt: skip
        report["data_expected"] = expected
    finally:
        ray.shutdown()
    mark("shutdown")
    print("REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
