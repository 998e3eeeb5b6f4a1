"""Ray Serve replicas and Ray Data batch inference against one process: parity, throughput, and a
replica killed mid-request. Ray runs only inside a loopback-only network namespace: the script
re-runs itself in one (``unshare``; HOME and Ray's temp folder in a fresh temp folder).

    python benchmarks/ray_scaleout.py [MODEL_DIR] [--part parity|throughput|kill|all]
        [--clients 8] [--seconds 60] [--json OUT]

parity      16 concurrent greedy requests (chat and completions, streamed and not) to one
            server process (the ``OpenAIServer`` replica class on uvicorn, 1 thread) and to
            ``genai-runtime serve --ray --replicas 2 --threads 1``: every reply must be equal.
            Ray Data's HTTP processor (the Ray guide's zero-code path) against the first server.
            Then 32 prompts (+ one over the context) through ``map_batches`` with 2 actors and
            batches of 8, against the local ``Generator`` (batch_size 8, right-padded; and
            batch_size 1, for the int4 note).
throughput  N clients for S seconds of streamed chat (temperature 0.7, per-request seeds,
            max_tokens 32): one server process with 2 threads (max_active = N);
            ``genai-runtime serve --ray --replicas 2 --threads 1`` (max_active N/2 each); and
            for S/2 seconds one replica with 1 thread, and the same without Ray (max_active
            N/2): requests/s, tokens/s, p50/p99 time to first token, setups alternated over
            ``--rounds``, medians. Then ``map_batches`` (2 actors x 1 thread, batch 8, Ray and
            model start included) against local batched loops over the same 32 prompts: our
            ``Generator`` (batch 8, 2 threads) and the batch runner (2 threads, and 1 thread).
kill        ``genai-runtime serve --ray --replicas 2``; N clients send greedy requests; after 8 s
            one replica's actor is killed. Reports every request's outcome, one client-side
            retry per failure, requests lost, and when the deployment was whole again.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_MODEL = HERE.parents[1] / "shared" / "models" / "smollm2-135m-instruct-int4"
TOPICS = ["the sea", "a robot", "autumn", "coffee", "a lighthouse", "chess", "rain", "bees",
          "volcanoes", "the moon", "bread", "trains", "owls", "glaciers", "jazz", "deserts",
          "maps", "candles", "kites", "snow", "bridges", "tea", "foxes", "clocks", "rivers",
          "libraries", "salt", "thunder", "gardens", "ships", "mirrors", "wolves"]  # fmt: skip
PORT = 8000


# -- servers ------------------------------------------------------------------------------------


def serve_local(model_dir: str, threads: int, max_active: int, port: int) -> None:
    """A server process without Ray: the replica class on uvicorn (``--serve-local``)."""
    import uvicorn

    from genai_runtime.integrations.ray import OpenAIServer
    from genai_runtime.server.app import create_app

    replica = OpenAIServer(model_dir, threads=threads, max_active=max_active, max_queued=64)
    config = uvicorn.Config(create_app(replica.state), port=port, log_level="error")
    uvicorn.Server(config).run()


def start_server(cmd: list[str], log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    import httpx

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[:6]} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        # The CLI prints its "serving" line once every replica runs (serve.run waits for that).
        ready = "--ray" not in cmd or "serving " in log.read_text()
        try:
            if ready and httpx.get(f"http://127.0.0.1:{PORT}/health", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{cmd[:6]} did not become healthy:\n{log.read_text()[-3000:]}")


def stop_server(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def local_cmd(model_dir: str, threads: int, max_active: int) -> list[str]:
    return [sys.executable, __file__, model_dir, "--serve-local", str(threads),
            "--max-active", str(max_active)]  # fmt: skip


def ray_cmd(model_dir: str, replicas: int, threads: int, max_active: int) -> list[str]:
    return [sys.executable, "-m", "genai_runtime", "serve", model_dir, "--ray",
            "--replicas", str(replicas), "--threads", str(threads), "--port", str(PORT),
            "--max-active", str(max_active), "--max-queued", "64"]  # fmt: skip


# -- CPU accounting -----------------------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")
WORKERS = ("ServeReplica", "MapWorker", "--serve-local")  # processes that run the model


def cpu_by_role() -> dict[str, float]:
    """CPU seconds used so far by the other processes of this PID namespace (the script runs in
    its own), split into model workers and the rest (Ray's proxy, controller, raylet, GCS...).
    The machine is shared: tokens per CPU-second do not depend on how much of it we got."""
    out = {"workers": 0.0, "ray and proxies": 0.0, "exited children": 0.0}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()  # fields from the 3rd (state) on
        seconds = (int(fields[11]) + int(fields[12])) / TICK  # utime + stime
        role = "workers" if any(w in cmd for w in WORKERS) else "ray and proxies"
        out[role] += seconds
        # Children that ended (Ray Data's actors once the dataset is done) count to their parent.
        out["exited children"] += (int(fields[13]) + int(fields[14])) / TICK
    return out


def cpu_since(before: dict[str, float]) -> dict[str, float]:
    now = cpu_by_role()
    return {role: round(now[role] - before.get(role, 0.0), 1) for role in now}


# -- clients ------------------------------------------------------------------------------------


def client(timeout: float = 300):
    import openai

    return openai.OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key="x", max_retries=0,
                         timeout=timeout)  # fmt: skip


def greedy_request(name: str, i: int) -> list[Any]:
    """Request i of the parity set: chat or completion, streamed or not; text, reason, usage."""
    c = client()
    common = dict(model=name, temperature=0, max_tokens=32)
    prompt = f"Write one sentence about {TOPICS[i]}."
    stream = dict(stream=True, stream_options={"include_usage": True})
    if i % 4 == 0:
        r = c.chat.completions.create(messages=[{"role": "user", "content": prompt}], **common)
        return [r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens]
    if i % 4 == 1:
        chunks = list(c.chat.completions.create(
            messages=[{"role": "user", "content": prompt}], **common, **stream))  # fmt: skip
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        return [text, chunks[-2].choices[0].finish_reason, chunks[-1].usage.completion_tokens]
    if i % 4 == 2:
        r = c.completions.create(prompt=prompt, **common)
        return [r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens]
    chunks = list(c.completions.create(prompt=prompt, **common, **stream))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    return [text, chunks[-2].choices[0].finish_reason, chunks[-1].usage.completion_tokens]


def load(name: str, clients: int, seconds: float) -> dict[str, Any]:
    """``clients`` threads send streamed chat requests back to back for ``seconds``."""
    c = client()

    def one(i: int) -> tuple[float, int]:
        start = time.perf_counter()
        ttft, tokens = None, 0
        stream = c.chat.completions.create(
            model=name, messages=[{"role": "user", "content": f"Write two sentences about "
                                   f"{TOPICS[i % len(TOPICS)]}."}],
            max_tokens=32, temperature=0.7, seed=i, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        for chunk in stream:
            if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                ttft = time.perf_counter() - start
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        return (ttft if ttft is not None else time.perf_counter() - start), tokens

    for i in range(clients):  # warm-up: every row allocated once
        one(i)
    ttfts: list[float] = []
    tokens = [0]
    failures: list[str] = []
    lock = threading.Lock()
    cpu_before, client_before = cpu_by_role(), time.process_time()
    stop_at = time.perf_counter() + seconds

    def worker(k: int) -> None:
        i = k
        while time.perf_counter() < stop_at:
            try:
                t, n = one(i)
                with lock:
                    ttfts.append(t)
                    tokens[0] += n
            except Exception as exc:
                with lock:
                    failures.append(f"{type(exc).__name__}: {exc}")
            i += clients

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    cpu = cpu_since(cpu_before)
    q = statistics.quantiles(ttfts, n=100) if len(ttfts) > 1 else ttfts * 99
    return {
        "cpu_s": cpu,
        "client_cpu_s": round(time.process_time() - client_before, 1),
        "tokens_per_worker_cpu_s": round(tokens[0] / max(cpu["workers"], 1e-9), 2),
        "tokens_per_server_cpu_s": round(tokens[0] / max(sum(cpu.values()), 1e-9), 2),
        "requests": len(ttfts),
        "failed": len(failures),
        "seconds": round(elapsed, 1),
        "requests_per_s": round(len(ttfts) / elapsed, 3),
        "tokens_per_s": round(tokens[0] / elapsed, 2),
        "ttft_p50_ms": round(q[49] * 1000),
        "ttft_p99_ms": round(q[98] * 1000),
        "failures": failures[:5],
    }


# -- batch references ---------------------------------------------------------------------------


def chat_prompts(tok) -> list[np.ndarray]:
    asks = [[{"role": "user", "content": f"Write one sentence about {t}."}] for t in TOPICS]
    return [tok.encode(tok.apply_chat_template(messages)) for messages in asks]


def generator_greedy(model, prompts: list[np.ndarray], batch: int, new: int) -> list[list[int]]:
    """Greedy tokens per prompt from our ``Generator``, ``batch`` right-padded rows at a time
    (EOS kept at the end of a row that stopped, like the predictor's token ids)."""
    import genai_runtime as og

    eos = set(model.spec.tokens.eos)
    out = []
    for k in range(0, len(prompts), batch):
        group = prompts[k : k + batch]
        width = max(len(p) for p in group)
        ids = np.full((len(group), width), model.spec.tokens.pad, np.int32)
        for i, p in enumerate(group):
            ids[i, : len(p)] = p
        params = og.GeneratorParams(model)
        params.set_search_options(batch_size=len(group), max_length=width + new)
        gen = og.Generator(model, params)
        gen.append_tokens(ids)
        steps = []
        while not gen.is_done() and len(steps) < new:
            gen.generate_next_token()
            steps.append(gen.get_next_tokens())
        for row in np.array(steps).T.tolist():
            out.append(row[: next((j + 1 for j, t in enumerate(row) if t in eos), len(row))])
    return out


def map_batches(ray, model_dir: str, max_tokens: int, extra: list[dict] | None = None):
    from genai_runtime.integrations.ray import generate_dataset

    ray.data.DataContext.get_current().execution_options.preserve_order = True
    items = [{"row": i, "prompt": f"Write one sentence about {t}."} for i, t in enumerate(TOPICS)]
    for at, item in extra or []:
        items.insert(at, item)
    ds = generate_dataset(ray.data.from_items(items), model_dir, actors=2, batch_size=8,
                          threads=1, max_tokens=max_tokens, token_ids=True)  # fmt: skip
    start = time.perf_counter()
    rows = ds.take_all()
    return rows, time.perf_counter() - start


def http_processor(ray, name: str, topics: list[str]) -> list[str]:
    """The Ray guide's zero-code snippet (docs/guide/ray.md), pointed at the server on ``PORT``."""
    from ray.data.llm import HttpRequestProcessorConfig, build_processor

    config = HttpRequestProcessorConfig(
        url=f"http://127.0.0.1:{PORT}/v1/chat/completions", concurrency=1
    )
    processor = build_processor(
        config,
        preprocess=lambda row: {
            "payload": {
                "model": name,
                "messages": [{"role": "user", "content": row["prompt"]}],
                "temperature": 0,
                "max_tokens": 32,
            }
        },
        postprocess=lambda row: {
            "prompt": row["prompt"],
            "answer": row["http_response"]["choices"][0]["message"]["content"],
        },
    )
    prompts = [f"Write one sentence about {t}." for t in topics]
    rows = processor(ray.data.from_items([{"prompt": p} for p in prompts])).take_all()
    by_prompt = {r["prompt"]: r["answer"] for r in rows}
    return [by_prompt[p] for p in prompts]


# -- parts --------------------------------------------------------------------------------------


def part_parity(model_dir: str, home: Path) -> dict[str, Any]:
    import ray

    import genai_runtime as og
    from genai_runtime.integrations.loading import load_model

    name = Path(model_dir).resolve().name
    out: dict[str, Any] = {}
    proc = start_server(local_cmd(model_dir, 1, 4), home / "local.log")
    try:
        with ThreadPoolExecutor(16) as pool:
            local = list(pool.map(lambda i: greedy_request(name, i), range(16)))
        # The zero-code path: Ray Data's HTTP processor against the same server, the same
        # chat requests as the non-streamed chat ones above (0, 4, 8, 12).
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            answers = http_processor(ray, name, [TOPICS[i] for i in (0, 4, 8, 12)])
        finally:
            ray.shutdown()
    finally:
        stop_server(proc)
    out["http_processor_equal"] = sum(a == local[i][0] for a, i in zip(answers, (0, 4, 8, 12)))
    proc = start_server(ray_cmd(model_dir, 2, 1, 4), home / "serve.log")
    with ThreadPoolExecutor(16) as pool:
        replicas = list(pool.map(lambda i: greedy_request(name, i), range(16)))
    out["serve_exit"] = stop_server(proc)
    out["serve_equal"] = sum(a == b for a, b in zip(local, replicas))
    out["serve_examples"] = replicas[:2]
    out["serve_mismatches"] = [[i, a, b] for i, (a, b) in enumerate(zip(local, replicas)) if a != b]

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        over = {"row": -1, "prompt": "word " * 2100}  # over the default 2048-token context
        rows, seconds = map_batches(ray, model_dir, 32, extra=[(16, over)])
    finally:
        ray.shutdown()
    out["map_batches_s"] = round(seconds, 1)
    out["order"] = [r["row"] for r in rows] == [*range(16), -1, *range(16, 32)]
    failed = next(r for r in rows if r["row"] == -1)
    out["error_row"] = [failed["finish_reason"], failed["error"]]
    got = [list(map(int, r["generated_token_ids"])) for r in rows if r["row"] != -1]
    model = load_model(model_dir, threads=1)
    prompts = chat_prompts(og.Tokenizer(model))
    batched = generator_greedy(model, prompts, 8, 32)
    single = generator_greedy(model, prompts, 1, 32)
    out["map_batches_equal_generator_batch8"] = sum(a == b for a, b in zip(got, batched))
    out["map_batches_equal_generator_batch1"] = sum(a == b for a, b in zip(got, single))
    out["generator_batch1_equal_batch8"] = sum(a == b for a, b in zip(single, batched))
    return out


def part_throughput(
    model_dir: str, home: Path, clients: int, seconds: float, rounds: int
) -> dict[str, Any]:
    import ray

    import genai_runtime as og
    from genai_runtime.integrations.batch import BatchRunner, RowSettings
    from genai_runtime.integrations.loading import load_model

    name = Path(model_dir).resolve().name
    half = max(1, clients // 2)
    setups = {
        "1 process x 2 threads": (local_cmd(model_dir, 2, clients), seconds),
        "2 replicas x 1 thread": (ray_cmd(model_dir, 2, 1, half), seconds),
        "1 replica x 1 thread": (ray_cmd(model_dir, 1, 1, half), seconds / 2),
        # The same replica without Ray: what Serve's proxy costs per replica.
        "1 process x 1 thread": (local_cmd(model_dir, 1, half), seconds / 2),
    }
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in setups}
    order = list(setups)
    for r in range(rounds):  # setups alternate, a different one first each round
        for label in order[r % len(order) :] + order[: r % len(order)]:
            cmd, length = setups[label]
            proc = start_server(cmd, home / "throughput.log")
            try:
                result = load(name, clients, length)
            finally:
                stop_server(proc)
            result["loadavg_1min_after"] = round(os.getloadavg()[0], 2)
            runs[label].append(result)
    out: dict[str, Any] = {"rounds": rounds, "per_round": runs}
    keys = ("requests_per_s", "tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "failed",
            "tokens_per_worker_cpu_s", "tokens_per_server_cpu_s")  # fmt: skip
    for label, results in runs.items():
        out[label] = {key: statistics.median(x[key] for x in results) for key in keys}

    kinds = ("map_batches", "local_generator_batch8", "local_generator_with_load",
             "local_batch_runner", "local_batch_runner_1_thread")  # fmt: skip
    batch_runs: dict[str, list[float]] = {kind: [] for kind in kinds}
    cpu_runs: dict[str, list[float]] = {kind: [] for kind in kinds}
    tokens = 0
    for _ in range(rounds):
        cpu_before = cpu_by_role()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            rows, wall = map_batches(ray, model_dir, 32)
            cpu = cpu_since(cpu_before)  # before shutdown ends the processes
        finally:
            ray.shutdown()
        tokens = sum(int(r["num_tokens"]) for r in rows)
        batch_runs["map_batches"].append(tokens / wall)
        cpu_runs["map_batches"].append(tokens / sum(cpu.values()))  # all of Ray, loads included
        start, cpu0 = time.perf_counter(), time.process_time()
        model = load_model(model_dir, threads=2)
        loaded, cpu1 = time.perf_counter(), time.process_time()
        prompts = chat_prompts(og.Tokenizer(model))
        generator_greedy(model, prompts, 8, 32)
        done, cpu2 = time.perf_counter(), time.process_time()
        runner = BatchRunner(model, og.Tokenizer(model), rows=8)
        runner.run(prompts, [RowSettings(max_tokens=32)] * len(prompts))
        ran, cpu3 = time.perf_counter(), time.process_time()
        batch_runs["local_generator_with_load"].append(tokens / (done - start))
        cpu_runs["local_generator_with_load"].append(tokens / (cpu2 - cpu0))
        batch_runs["local_generator_batch8"].append(tokens / (done - loaded))
        cpu_runs["local_generator_batch8"].append(tokens / (cpu2 - cpu1))
        batch_runs["local_batch_runner"].append(tokens / (ran - done))
        cpu_runs["local_batch_runner"].append(tokens / (cpu3 - cpu2))
        model = load_model(model_dir, threads=1)
        runner = BatchRunner(model, og.Tokenizer(model), rows=8)
        start, cpu0 = time.perf_counter(), time.process_time()
        runner.run(prompts, [RowSettings(max_tokens=32)] * len(prompts))
        batch_runs["local_batch_runner_1_thread"].append(tokens / (time.perf_counter() - start))
        cpu_runs["local_batch_runner_1_thread"].append(tokens / (time.process_time() - cpu0))
    out["batch_tokens"] = tokens
    out["batch_tokens_per_cpu_s"] = {
        k: {"median": round(statistics.median(v), 2), "runs": [round(x, 2) for x in v]}
        for k, v in cpu_runs.items()
    }
    out["batch_tokens_per_s"] = {
        k: {"median": round(statistics.median(v), 2), "runs": [round(x, 2) for x in v]}
        for k, v in batch_runs.items()
    }
    return out


def part_kill(model_dir: str, home: Path, clients: int) -> dict[str, Any]:
    import ray
    from ray import serve

    from genai_runtime.integrations.ray.serve import APP_NAME

    name = Path(model_dir).resolve().name
    proc = start_server(ray_cmd(model_dir, 2, 1, max(1, clients // 2)), home / "kill.log")
    ray.init(address="auto", log_to_driver=False)  # join the CLI's cluster
    records: list[dict[str, Any]] = []
    lock = threading.Lock()
    t0 = time.perf_counter()
    stop_at = t0 + 40

    def attempt(i: int) -> str | None:
        try:
            greedy_request(name, i % 16)
            return None
        except Exception as exc:
            return f"{type(exc).__name__}: {str(exc)[:80]}"

    def worker(k: int) -> None:
        i = k
        while time.perf_counter() < stop_at:
            start = time.perf_counter() - t0
            error = attempt(i)
            retry = "not needed"
            if error is not None:
                time.sleep(1.0)
                retry = attempt(i) or "ok"
            with lock:
                records.append({"start": round(start, 2), "end": round(time.perf_counter() - t0, 2),
                                "error": error, "retry": retry})  # fmt: skip
            i += clients

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    time.sleep(8)
    replicas = sorted(
        a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("SERVE_REPLICA::")
    )  # fmt: skip
    killed_at = time.perf_counter() - t0
    ray.kill(ray.get_actor(replicas[0], namespace="serve"), no_restart=True)
    # Serve's status lags the death: "noticed" is the first poll with fewer than 2 running
    # replicas, "whole again" the first one after it with 2 running and the dead one gone.
    noticed_at = whole_at = None
    while time.perf_counter() < stop_at:
        deployment = serve.status().applications[APP_NAME].deployments["OpenAIServer"]
        running = deployment.replica_states.get("RUNNING", 0)
        now = time.perf_counter() - t0
        if noticed_at is None and running < 2:
            noticed_at = now
        elif noticed_at is not None and whole_at is None and running == 2:
            names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
            if replicas[0] not in names:
                whole_at = now
        time.sleep(0.1)
    for t in threads:
        t.join()
    after = sorted(
        a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("SERVE_REPLICA::")
    )  # fmt: skip
    ray.shutdown()
    exit_code = stop_server(proc)
    failed = [r for r in records if r["error"]]
    return {
        "killed": replicas[0],
        "replicas_before": len(replicas),
        "replicas_after": len(after),
        "replaced": replicas[0] not in after,
        "killed_at_s": round(killed_at, 2),
        "serve_noticed_at_s": noticed_at and round(noticed_at, 2),
        "whole_again_at_s": whole_at and round(whole_at, 2),
        "requests": len(records),
        "failed_first_try": len(failed),
        "in_flight_at_kill": sum(r["start"] <= killed_at <= r["end"] for r in records),
        "recovered_by_retry": sum(r["retry"] == "ok" for r in failed),
        "lost": sum(r["retry"] not in ("ok", "not needed") for r in records),
        "failed_after_recovery": sum(1 for r in failed if whole_at and r["start"] > whole_at),
        "errors": {e: sum(r["error"] == e for r in failed) for e in {r["error"] for r in failed}},
        "serve_exit": exit_code,
    }


# -- driver -------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", nargs="?", default=str(DEFAULT_MODEL))
    ap.add_argument("--part", choices=["parity", "throughput", "kill", "all"], default="all")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--rounds", type=int, default=2, help="throughput rounds, setups alternated")
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--serve-local", type=int, metavar="THREADS", help=argparse.SUPPRESS)
    ap.add_argument("--max-active", type=int, default=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_local:
        return serve_local(args.model_dir, args.serve_local, args.max_active, PORT)

    from genai_runtime.integrations.loopback import isolated, namespace_problem, only_loopback

    if not only_loopback():  # run again inside a fresh loopback-only namespace
        problem = namespace_problem()
        if problem:
            sys.exit(f"cannot isolate Ray here: {problem}")
        with tempfile.TemporaryDirectory(prefix="rs.") as home:
            argv, env = isolated([sys.executable, *sys.argv], home)
            sys.exit(subprocess.run(argv, env=env).returncode)

    home = Path(os.environ["HOME"])
    report: dict[str, Any] = {"model": args.model_dir, "clients": args.clients}
    parts = ["parity", "throughput", "kill"] if args.part == "all" else [args.part]
    for part in parts:
        start = time.perf_counter()
        if part == "parity":
            report[part] = part_parity(args.model_dir, home)
        elif part == "throughput":
            report[part] = part_throughput(
                args.model_dir, home, args.clients, args.seconds, args.rounds
            )
        else:
            report[part] = part_kill(args.model_dir, home, args.clients)
        print(f"== {part} ({time.perf_counter() - start:.0f} s)")
        print(json.dumps(report[part], indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
