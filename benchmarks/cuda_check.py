"""One-shot CUDA check: random-weight exports, greedy parity, speed, batched server, census.

    python benchmarks/cuda_check.py all --tokenizer TOK_DIR --out OUT [--budget-s 400]
    python benchmarks/cuda_check.py all --device cpu --folders F... --out OUT --skip models

Parts, in order, each bounded by its share of --budget-s (time a part leaves goes to the next)
and each in try/except; results.json and results.md are rewritten in --out after every step:
models (3 random fp16 checkpoints, 6 reference-builder exports in parallel), parity (greedy
tokens, ours vs the reference; on CUDA also ours with CUDA graphs vs the reference without),
speed (prefill/decode tok/s, CUDA graph variants), server (ServerEngine in-process, 1 vs 8
streams), census (genai_runtime's device census, if any). Ours and onnxruntime-genai never
share a process: every measurement runs in a worker subprocess of this script that prints
"@@ {json}" lines. --device cpu runs on whatever provider each folder names and skips the CUDA
checks and the graph variants.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
LLAMA, QWEN = "llama", "qwen2"
SHAPES = {  # name -> (architecture, config); vocabulary 49152 = SmolLM2's tokenizer
    "1b": (LLAMA, dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                       num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0)),
    "small": (LLAMA, dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, rope_theta=100000.0)),
    "qwen": (QWEN, dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                        num_attention_heads=14, num_key_value_heads=2, rope_theta=1000000.0)),
}  # fmt: skip
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
SHARE = {"models": 0.45, "parity": 0.17, "speed": 0.28, "server": 0.08, "census": 0.02}
PREFERRED = ["1b-fp16", "1b-int4", "small-fp16", "qwen-fp16", "small-int4", "qwen-int4"]
B1_PROMPT = [1, 504, 3458, 314, 260, 3575]
B8_LENGTHS = [6, 3, 7, 2, 12, 9, 5, 16]
# case -> (batch, new tokens, setting); "graph" cases (CUDA only) run ours with the folder's
# enable_cuda_graph on, against the reference with it on at batch 1 and off at batch 8 (it
# refuses a batched prompt pass with a graph); "b1-256" runs past a max_length of 256, where the
# reference's own logits depend on max_length, and "logits" runs it again recording every
# step's logits (LOGITS_DIR) to say where and by how much the two depart, if they do
CASES = {"b1": (1, 128, None), "b8": (8, 64, None), "b1-noshare": (1, 128, False),
         "b1-graph": (1, 128, "graph"), "b8-graph": (8, 64, "graph"), "b1-256": (1, 256, None),
         "logits": (1, 256, None)}  # fmt: skip
LOGITS_DIR = Path("/tmp/cuda_check_logits")
PROMPT_LEN, SPEED_NEW, REPS, SERVER_TOKENS = 512, 128, 5, 128
SERVER_PROMPTS = [
    "Once upon a time, in a land far away,", "The three most important inventions are",
    "def fibonacci(n):", "Write a short poem about the sea:", "The capital of France is",
    "In machine learning, overfitting means", "My favourite pancake recipe starts with",
    "The history of the printing press",
]  # fmt: skip
R: dict = {"env": {}, "parts": {}, "models": {}, "parity": {}, "speed": {}, "server": {},
           "census": {}, "errors": []}  # fmt: skip
OUT: Path | None = None


def log(*a) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def emit(**record) -> None:
    print("@@ " + json.dumps(record), flush=True)


def child_env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def child(args: list[str], timeout: float) -> tuple[list[dict], dict]:
    """Run this script as a worker: its "@@" records (also those printed before a timeout or
    a crash) and a status (rc, seconds, stderr tail when it failed)."""
    start, cmd = time.perf_counter(), [sys.executable, str(HERE), *args]
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=max(timeout, 1), env=child_env())
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as exc:
        out, err, rc = exc.stdout, exc.stderr, "timeout"
    out, err = (b.decode(errors="replace") if b else "" for b in (out, err))
    records = []
    for line in out.splitlines():
        if line.startswith("@@ "):
            with contextlib.suppress(ValueError):  # a line cut short by a kill
                records.append(json.loads(line[3:]))
    status = {"rc": rc, "s": round(time.perf_counter() - start, 1)}
    if rc != 0:
        status["stderr_tail"] = err[-1500:]
    return records, status


def save() -> None:
    if OUT is None:
        return
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in (("results.json", json.dumps(R, indent=1)), ("results.md", markdown())):
        (OUT / f"{name}.tmp").write_text(text)
        (OUT / f"{name}.tmp").replace(OUT / name)


def fmt(x, spec=".0f") -> str:
    return "-" if x is None else format(x, spec)


def table(head: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + [
        "| " + " | ".join(map(str, r)) + " |" for r in rows
    ]


def markdown() -> str:
    md = ["# cuda_check results", "", "```", *(f"{k}: {v}" for k, v in R["env"].items()), "```"]
    md += ["", *(f"- part {k}: {v}" for k, v in R["parts"].items())]
    exports = R["models"].get("exports", {})
    rows = [[k, v.get("ok"), v.get("s")] for k, v in exports.items()]
    md += ["", "## Models", "", *table(["export", "ok", "seconds"], rows)]
    rows = [
        [f, case, c.get("equal", "error"), c.get("first_diff"),
         f"{c.get('ours_device')}/{c.get('ref_device')}", c.get("graph"),
         str(c.get("error", ""))[:120]]
        for f, cases in R["parity"].items() for case, c in cases.items()
    ]  # fmt: skip
    md += ["", "## Parity (greedy tokens, ours vs reference)", ""]
    head = ["folder", "case", "equal", "first diff [row, i]", "devices", "ours graph", "error"]
    md += table(head, rows)
    departures = [(f, cases["logits"]["departure"]) for f, cases in R["parity"].items()
                  if "departure" in cases.get("logits", {})]  # fmt: skip
    md += ["", "Logits along the b1-256 run (ours vs reference):", ""]
    md += [f"- {f}: {json.dumps(d)}" for f, d in departures] or ["- none recorded"]
    rows = []
    for folder, m in R["speed"].items():
        for v in ("b1", "b1-graph", "b8"):
            ref, ours = m.get(f"ref:{v}", {}), m.get(f"ours:{v}", {})
            keys = ("prefill_tps", "decode_tps", "steady_decode_tps")
            tps = [d.get(k) for k in keys for d in (ref, ours)]
            ratios = [fmt(m.get(f"ratio:{v}:{k}"), ".2f") for k in ("prefill", "decode", "steady")]
            notes = [
                (n, d.get("error") or d.get("warnings") or d.get("graph_note"))
                for n, d in (("ref", ref), ("ours", ours))
            ]
            errors = "; ".join(f"{n}: {e}"[:160] for n, e in notes if e)
            if ref or ours:
                rows.append([folder, v, *map(fmt, tps), *ratios, errors])
    md += ["", f"## Speed (tok/s, median of {REPS}; ratio = ours / reference)", ""]
    head = ["folder", "variant", "ref prefill", "ours prefill", "ref decode", "ours decode"]
    head += ["ref steady", "ours steady", "prefill ratio", "decode ratio", "steady ratio"]
    md += table([*head, "notes"], rows)
    s = R["server"]
    keys = ("folder", "slots", "tps_1", "tps_8", "ratio_8_over_1", "texts_equal_solo", "error")
    md += ["", "## Server engine, in-process (decode tok/s)", ""]
    md += [f"- {k}: {s[k]}" for k in keys if k in s]
    md += ["", "## Census", "", "```", json.dumps(R["census"], indent=1)[:4000], "```"]
    md += ["", "## Errors", "", *(f"- {e[:400]}" for e in R["errors"])]
    return "\n".join(md) + "\n"


def part_env(args, deadline: float) -> None:
    py = "import {0} as m; print(m.__version__, m.__file__, {1})"
    probes = {
        "nvidia-smi": ["nvidia-smi", "-L"],
        "python": [sys.executable, "-VV"],
        "onnxruntime": ["-c", py.format("onnxruntime", "m.get_available_providers()")],
        "onnxruntime_genai": ["-c", py.format("onnxruntime_genai", "''")],
        "torch": ["-c", py.format("torch", "m.version.cuda, m.cuda.is_available()")],
        "transformers": ["-c", py.format("transformers", "''")],
        "git": ["git", "-C", str(ROOT), "log", "-1", "--format=%H %cI"],
    }

    def probe(cmd):
        cmd = [sys.executable, *cmd] if cmd[0] == "-c" else cmd
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=child_env())
            return (p.stdout.strip() or p.stderr.strip()[-300:]) + f" (rc {p.returncode})"
        except Exception as exc:
            return f"unavailable: {exc}"

    with ThreadPoolExecutor(len(probes)) as pool:
        R["env"].update(zip(probes, pool.map(probe, probes.values())))
    R["env"].update(cpus=os.cpu_count(), device=args.device, budget_s=args.budget_s)


# -- models ------------------------------------------------------------------------------------


def worker_ckpt(args) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    classes = {LLAMA: (LlamaConfig, LlamaForCausalLM), QWEN: (Qwen2Config, Qwen2ForCausalLM)}
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for name in args.names:
        start, folder = time.perf_counter(), Path(args.models_dir) / f"hf-{name}"
        arch, shape = SHAPES[name]
        if not (folder / "DONE").exists():
            config = classes[arch][0](
                vocab_size=49152, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096,
                tie_word_embeddings=True, **shape,
            )  # fmt: skip
            if isinstance(getattr(config, "rope_parameters", None), dict):  # transformers 5
                config.rope_parameters["rope_theta"] = shape["rope_theta"]
            torch.manual_seed(0)
            with torch.device(dev):
                model = classes[arch][1](config).to(torch.float16)
            gen = torch.Generator(device=dev).manual_seed(0)
            with torch.no_grad():  # wide weights: clear argmax winners in fp16; biases non-zero
                for pname, p in model.named_parameters():
                    if p.dim() == 2 or pname.endswith(".bias"):
                        p.normal_(0.0, 0.05, generator=gen)
            model.to("cpu").save_pretrained(folder)
            for f in TOKENIZER_FILES:
                shutil.copyfile(Path(args.tokenizer) / f, folder / f)
            (folder / "DONE").write_text("ok")
            del model
        emit(name=name, folder=str(folder), s=round(time.perf_counter() - start, 1), device=dev)


def tail(path: Path) -> str:
    return path.read_text(errors="replace")[-2000:]


def start_export(mdir: Path, ckpt: str, name: str, precision: str) -> subprocess.Popen:
    cache = str(mdir / f"cache-{name}")
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", ckpt, "-o",
           str(mdir / name), "-p", precision, "-e", "cuda", "-c", cache]  # fmt: skip
    with open(mdir / f"logs/{name}.log", "w") as logf:
        return subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=child_env())


def part_models(args, deadline: float) -> None:
    """Checkpoints one after another in a torch worker; each one's two exports start as soon as
    it is saved, all in parallel."""
    mdir, tok = Path(args.models_dir).resolve(), Path(args.tokenizer).resolve()
    missing = [f for f in TOKENIZER_FILES if not (tok / f).is_file()]
    if missing:
        raise FileNotFoundError(f"--tokenizer {tok} lacks {missing}")
    (mdir / "logs").mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(HERE), "ckpt", "--models-dir", str(mdir), "--tokenizer", str(tok),
           "--names", *args.names]  # fmt: skip
    with open(mdir / "logs/ckpt.log", "w") as err:
        ckpt = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=child_env())
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in ckpt.stdout], daemon=True)
    reader.start()
    running: dict[str, tuple[subprocess.Popen, float]] = {}
    exports = R["models"].setdefault("exports", {})
    while time.time() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            line = ""
        if line.startswith("@@ "):
            rec = json.loads(line[3:])
            R["models"].setdefault("checkpoints", {})[rec["name"]] = rec
            log("checkpoint", rec)
            for name in (f"{rec['name']}-fp16", f"{rec['name']}-int4"):
                if (mdir / name / "genai_config.json").exists():
                    exports[name] = {"ok": True, "s": 0, "folder": str(mdir / name), "reused": 1}
                else:
                    proc = start_export(mdir, rec["folder"], name, name.rsplit("-", 1)[1])
                    running[name] = (proc, time.time())
        for name, (proc, t0) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[name]
            ok = proc.returncode == 0 and (mdir / name / "genai_config.json").exists()
            exports[name] = {"ok": ok, "rc": proc.returncode, "s": round(time.time() - t0, 1),
                             "folder": str(mdir / name)}  # fmt: skip
            if ok:
                for f in TOKENIZER_FILES:
                    shutil.copyfile(tok / f, mdir / name / f)
                config = mdir / name / "genai_config.json"  # for the record, in results.json
                exports[name]["genai_config"] = json.loads(config.read_text())
            else:
                exports[name]["tail"] = tail(mdir / f"logs/{name}.log")
            log("export", name, {k: v for k, v in exports[name].items() if k != "tail"})
            save()
        if not reader.is_alive() and lines.empty() and not running:  # all read, all exported
            break
    for name, (proc, _) in running.items():
        proc.kill()
        exports[name] = {"ok": False, "rc": "timeout", "folder": str(mdir / name)}
        exports[name]["tail"] = tail(mdir / f"logs/{name}.log")
    if ckpt.poll() is None:
        ckpt.kill()
    if ckpt.wait() != 0:
        R["models"]["ckpt_log_tail"] = tail(mdir / "logs/ckpt.log")


# -- workers: ours / the reference -------------------------------------------------------------


def load_api(name: str, device: str):
    if device == "cuda":
        try:  # the CUDA libraries of the image's nvidia-* packages
            import onnxruntime

            onnxruntime.preload_dlls()
        except Exception as exc:
            print(f"preload_dlls: {exc}", file=sys.stderr)
    if name == "ref":
        import onnxruntime_genai as api
    else:
        import genai_runtime as api
    return api


def load_model(api, folder: str, overlay: dict | None, device: str, record: dict):
    import warnings

    config = api.Config(folder)
    if overlay:
        config.overlay(json.dumps(overlay))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = api.Model(config)
    record["device_type"] = model.device_type
    if caught:
        record["warnings"] = [str(w.message)[:200] for w in caught]
    if device == "cuda" and model.device_type != "CUDA":
        raise RuntimeError(f"device_type is {model.device_type!r}, expected 'CUDA'")
    return model


def greedy(api, model, prompts: list[list[int]], new: int, rec: dict) -> list[list[int]]:
    """As tests/integration/test_gpu.py: right-padded with 0, one batched append_tokens."""
    import numpy as np

    width = max(len(p) for p in prompts)
    params = api.GeneratorParams(model)
    params.set_search_options(max_length=width + new, batch_size=len(prompts))
    generator = api.Generator(model, params)
    rec["graph_note"] = getattr(generator, "graph_note", None)  # ours: whether graphs replay
    generator.append_tokens(np.array([p + [0] * (width - len(p)) for p in prompts], np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return [generator.get_sequence(i).tolist() for i in range(len(prompts))]


def parity_prompts(batch: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(0)
    return [B1_PROMPT] if batch == 1 else [[1, *rng.integers(3, 32000, n - 1)] for n in B8_LENGTHS]


def greedy_logits(api, model, prompt: list[int], new: int, path: Path) -> list[int]:
    """Greedy generation reading every step's logits (saved to ``path``, float32 [new, V])."""
    import numpy as np

    params = api.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + new)
    generator = api.Generator(model, params)
    generator.append_tokens(np.array([prompt], np.int32))
    rows = []
    while not generator.is_done():
        rows.append(np.asarray(generator.get_logits(), np.float32).reshape(-1))
        generator.generate_next_token()
    np.save(path, np.stack(rows))
    return generator.get_sequence(0).tolist()


def worker_tokens(args) -> None:
    api = load_api("ref" if args.cmd == "ref-tokens" else "ours", args.device)
    models: dict = {}
    for case, (batch, new, setting) in CASES.items():
        if setting == "graph" and (
            args.device == "cpu" or (args.cmd == "ref-tokens" and batch > 1)
        ):
            continue  # the reference refuses a batched prompt pass with its graph on
        rec: dict = {"case": case}
        try:
            start = time.perf_counter()
            if setting not in models:
                overlay = {"search": {"past_present_share_buffer": setting}}
                if setting in (None, "graph"):
                    overlay = setting and graph_overlay(args.folder)
                models[setting] = load_model(api, args.folder, overlay, args.device, rec)
            rec["device_type"] = models[setting].device_type
            prompts = [[int(t) for t in p] for p in parity_prompts(batch)]
            if case == "logits":
                LOGITS_DIR.mkdir(parents=True, exist_ok=True)
                path = LOGITS_DIR / f"{Path(args.folder).name}-{args.cmd}.npy"
                rec["tokens"] = [greedy_logits(api, models[setting], prompts[0], new, path)]
                rec["logits"] = str(path)
            else:
                rec["tokens"] = greedy(api, models[setting], prompts, new, rec)
            rec["s"] = round(time.perf_counter() - start, 2)
        except Exception as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"[:500]
        emit(**rec)


def first_diff(a: list[list[int]], b: list[list[int]]) -> list[int] | None:
    for row, (x, y) in enumerate(zip(a, b)):
        i = next((i for i in range(max(len(x), len(y))) if x[i : i + 1] != y[i : i + 1]), None)
        if i is not None:
            return [row, i]
    return None if len(a) == len(b) else [min(len(a), len(b)), 0]


def logits_departure(ours: str, ref: str, prompt_len: int) -> dict:
    """Where two greedy runs' logits first differ, by how much up to where their tokens part,
    and the reference's top-2 margin there (a near tie that rounding may flip)."""
    import numpy as np

    a, b = np.load(ours), np.load(ref)
    n = min(len(a), len(b))
    top = np.argmax(a[:n], axis=1) != np.argmax(b[:n], axis=1)
    part = int(np.argmax(top)) if top.any() else None
    upto = n if part is None else part + 1
    diff = np.abs(a[:upto] - b[:upto]).max(axis=1)
    first = int(np.argmax(diff > 0)) if (diff > 0).any() else None
    out = {"steps": n, "tokens_part_at": part, "first_nonzero_diff_step": first,
           "max_abs_diff_before_parting": float(diff[: upto - 1].max()) if upto > 1 else 0.0,
           "median_abs_diff": float(np.median(diff)), "prompt_len": prompt_len}  # fmt: skip
    if part is not None:
        ranked = np.sort(b[part])[::-1]
        out.update(ref_top2_margin=float(ranked[0] - ranked[1]), diff_at_part=float(diff[part]))
    return out


def parity_folder(folder: str, args, deadline: float) -> None:
    jobs = [[c, "--folder", folder, "--device", args.device] for c in ("ref-tokens", "ours-tokens")]
    with ThreadPoolExecutor(2) as pool:
        (ref, ref_st), (ours, ours_st) = pool.map(lambda j: child(j, deadline - time.time()), jobs)
    cases = R["parity"].setdefault(Path(folder).name, {})
    for case in [c for c in CASES if args.device == "cuda" or not c.endswith("graph")]:
        ref_case = "b8" if case == "b8-graph" else case  # ours with a graph vs its without
        r = next((x for x in ref if x["case"] == ref_case), {"error": f"no record: {ref_st}"})
        o = next((x for x in ours if x["case"] == case), {"error": f"no record: {ours_st}"})
        c = cases[case] = {"ours_device": o.get("device_type"), "ref_device": r.get("device_type"),
                           "ours_s": o.get("s"), "ref_s": r.get("s"), "graph": o.get("graph_note"),
                           "warnings": o.get("warnings")}  # fmt: skip
        if "tokens" in r and "tokens" in o:
            c["first_diff"] = first_diff(o["tokens"], r["tokens"])
            c.update(equal=c["first_diff"] is None, lengths=[len(t) for t in r["tokens"]])
        else:
            c["error"] = f"ours: {o.get('error')} | ref: {r.get('error')}"
        if "logits" in r and "logits" in o:
            try:
                c["departure"] = logits_departure(o["logits"], r["logits"], len(B1_PROMPT))
            except Exception as exc:
                c["departure"] = {"error": repr(exc)[:300]}
    log("parity", Path(folder).name, {k: (v.get("equal"), v.get("first_diff")) for k, v in
                                      cases.items()})  # fmt: skip
    save()


def part_parity(args, deadline: float) -> None:
    with ThreadPoolExecutor(3) as pool:  # ref and ours of 3 folders at once
        for future in [pool.submit(parity_folder, f, args, deadline) for f in args.folders]:
            try:
                future.result()
            except Exception as exc:
                R["errors"].append(f"parity: {exc!r}")


# -- speed -------------------------------------------------------------------------------------


def graph_overlay(folder: str) -> dict:
    """The folder's provider options with the cuda entry's enable_cuda_graph "1": ours replaces
    the list, the reference merges by provider name (and a "1" anywhere enables capture)."""
    config = json.loads((Path(folder) / "genai_config.json").read_text())
    options = config["model"]["decoder"].get("session_options", {}).get("provider_options", [])
    entry = next((e for e in options if "cuda" in e), None)
    if entry is None:
        options.append({"cuda": {"enable_cuda_graph": "1"}})
    else:
        entry["cuda"]["enable_cuda_graph"] = "1"
    return {"model": {"decoder": {"session_options": {"provider_options": options}}}}


def timed_generation(api, model, ids, rec: dict) -> tuple[float, float, int, float]:
    """Seconds of append_tokens (prefill), seconds and count of the generated tokens, and the
    seconds of all but the first (which captures a CUDA graph where one is on)."""
    params = api.GeneratorParams(model)
    params.set_search_options(max_length=ids.shape[1] + SPEED_NEW, batch_size=ids.shape[0])
    gen = api.Generator(model, params)
    rec["graph_note"] = getattr(gen, "graph_note", None)  # ours: whether graphs replay
    t0 = time.perf_counter()
    gen.append_tokens(ids)
    t1, n, t2 = time.perf_counter(), 0, None
    while n < SPEED_NEW and not gen.is_done():
        gen.generate_next_token()
        n += 1
        t2 = t2 or time.perf_counter()
    end = time.perf_counter()
    return t1 - t0, end - t1, n, end - (t2 or end)


def worker_speed(args) -> None:
    import numpy as np

    api = load_api(args.api, args.device)
    for variant in args.variants:
        rec: dict = {"variant": variant, "api": args.api}
        try:
            overlay = graph_overlay(args.folder) if variant.endswith("graph") else None
            model = load_model(api, args.folder, overlay, args.device, rec)
            batch = 8 if variant == "b8" else 1
            ids = np.random.default_rng(1).integers(3, 32000, (batch, PROMPT_LEN)).astype(np.int32)
            timed_generation(api, model, ids, rec)  # warm-up (and graph capture)
            runs = [timed_generation(api, model, ids, rec) for _ in range(REPS)]
            prefill, decode, _, steady = (sorted(r[k] for r in runs)[REPS // 2] for k in range(4))
            rec.update(prefill_tps=batch * PROMPT_LEN / prefill, batch=batch, runs=runs,
                       decode_tps=batch * runs[0][2] / decode, tokens=runs[0][2],
                       steady_decode_tps=batch * (runs[0][2] - 1) / steady)  # fmt: skip
            model = None  # free it before the next variant loads
        except Exception as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"[:500]
        emit(**rec)


def preferred(folders: list[str]) -> list[str]:
    known = {Path(f).name: f for f in folders}
    return [known[n] for n in PREFERRED if n in known] or folders


def part_speed(args, deadline: float) -> None:
    variants = ["b1", "b8"] if args.device == "cpu" else ["b1", "b1-graph", "b8"]
    calls = [[v] for v in variants] if args.isolate_speed else [variants]
    for folder, vs, api in [(f, vs, a) for f in preferred(args.folders) for vs in calls
                            for a in ("ref", "ours")]:  # fmt: skip
        name, left = Path(folder).name, deadline - time.time()
        if left < 15:
            R["errors"].append(f"speed: no time left for {name} {api} {vs}")
            continue
        cmd = ["speed-run", "--api", api, "--folder", folder, "--device", args.device]
        records, status = child([*cmd, "--variants", *vs], min(left, 150))
        m = R["speed"].setdefault(name, {})
        m.update({f"{api}:{r['variant']}": r for r in records})
        for v in vs:
            m.setdefault(f"{api}:{v}", {"error": f"no record: {status}"})
            ref, ours = m.get(f"ref:{v}", {}), m.get(f"ours:{v}", {})
            for k, key in (("decode", "decode_tps"), ("prefill", "prefill_tps"),
                           ("steady", "steady_decode_tps")):  # fmt: skip
                if ref.get(key) and ours.get(key):
                    m[f"ratio:{v}:{k}"] = ours[key] / ref[key]
        got = [(r["variant"], fmt(r.get("decode_tps")), r.get("error")) for r in records]
        log("speed", name, api, status["rc"], got)
        save()


# -- server engine, in-process (no HTTP) -------------------------------------------------------


def worker_server(args) -> None:
    import asyncio

    import numpy as np

    api = load_api("ours", args.device)
    from genai_runtime.batching.settings import RequestSettings
    from genai_runtime.server import engine_over
    from genai_runtime.server.engine import Job

    model = load_model(api, args.folder, None, args.device, {})
    tok = api.Tokenizer(model)
    engine = engine_over(model, max_active=8, max_queued=32, max_context=1024)
    emit(kind="setup", slots=type(engine.slots).__name__, device_type=model.device_type)

    async def collect(job) -> str:
        parts = []
        while (event := await job.events.get())[0] == "delta":
            parts.append(event[1])
        if event[0] != "done":
            raise RuntimeError(f"engine error: {event[1]}")
        return "".join(parts)

    async def run(prompts: list[str], max_tokens: int = SERVER_TOKENS):
        loop, start, jobs = asyncio.get_running_loop(), time.monotonic(), []
        for text in prompts:
            s = RequestSettings(max_tokens=max_tokens, temperature=0.0)
            ids = np.asarray(tok.encode(text), np.int64)
            job = Job(prompt=ids, sampling=s, max_tokens=max_tokens, deadline=start + 300,
                      loop=loop, events=asyncio.Queue(), picker=engine.picker(s))  # fmt: skip
            jobs.append(job)
            engine.submit(job)
        texts = await asyncio.gather(*(collect(j) for j in jobs))
        end, tokens = time.monotonic(), sum(j.generated for j in jobs)
        first = max(j.first_token_at for j in jobs)  # decode: after every stream's first token
        return texts, {"streams": len(jobs), "tokens": tokens, "wall_tps": tokens / (end - start),
                       "decode_tps": (tokens - len(jobs)) / max(end - first, 1e-9)}  # fmt: skip

    try:
        asyncio.run(run(SERVER_PROMPTS[:1], 8))  # warm-up
        solo, one = asyncio.run(run(SERVER_PROMPTS[:1]))
        emit(kind="run", **one)
        many, eight = asyncio.run(run(SERVER_PROMPTS))
        emit(kind="run", **eight)
        equal = [many[0] == solo[0]]
        for i, text in enumerate(SERVER_PROMPTS[1:], 1):
            equal.append(many[i] == asyncio.run(run([text]))[0][0])
            emit(kind="equal", equal=equal)
    finally:
        engine.stop()


def part_server(args, deadline: float) -> None:
    folder = args.server_folder or preferred(args.folders)[0]
    cmd = ["server-run", "--folder", folder, "--device", args.device]
    records, status = child(cmd, min(deadline - time.time(), 200))
    s = R["server"]
    s.update(folder=Path(folder).name, status=status)
    for rec in records:
        if rec["kind"] == "setup":
            s.update(slots=rec["slots"], device_type=rec["device_type"])
        elif rec["kind"] == "run":
            s[f"run_{rec['streams']}"] = rec
            s[f"tps_{rec['streams']}"] = round(rec["decode_tps"], 1)
        else:
            s["texts_equal_solo"] = rec["equal"]
    if s.get("tps_1") and s.get("tps_8"):
        s["ratio_8_over_1"] = round(s["tps_8"] / s["tps_1"], 2)
    if status["rc"] != 0:
        s["error"] = f"rc {status['rc']}: {status.get('stderr_tail', '')[-300:]}"
    log("server", {k: v for k, v in s.items() if not k.startswith("run_") and k != "status"})


# -- census ------------------------------------------------------------------------------------


def worker_census(args) -> None:
    """genai_runtime.session.census.measure() over one decode step, then over 16."""
    import dataclasses

    import numpy as np

    api = load_api("ours", args.device)
    try:
        from genai_runtime.session.census import measure
    except ImportError as exc:
        return emit(note=f"no census in genai_runtime.session: skipped ({exc})")
    model = load_model(api, args.folder, None, args.device, {})
    params = api.GeneratorParams(model)
    params.set_search_options(max_length=64)
    gen = api.Generator(model, params)
    gen.append_tokens(np.array([B1_PROMPT], np.int32))
    for steps in (2, 1, 16):  # the first two unmeasured: the first token needs no decode run
        with measure() as m:
            for _ in range(steps):
                gen.generate_next_token()
        emit(steps=steps, seconds=m.seconds, host_seconds=m.host_seconds,
             census=dataclasses.asdict(m.census), device_type=model.device_type)  # fmt: skip


def part_census(args, deadline: float) -> None:
    folder = args.server_folder or preferred(args.folders)[0]
    cmd = ["census-run", "--folder", folder, "--device", args.device]
    records, status = child(cmd, min(deadline - time.time(), 60))
    R["census"] = {"folder": Path(folder).name, "records": records, "status": status}
    log("census", records[1:2] or records)


# -- main --------------------------------------------------------------------------------------

PARTS = {"models": part_models, "parity": part_parity, "speed": part_speed,
         "server": part_server, "census": part_census}  # fmt: skip
WORKERS = {"ckpt": worker_ckpt, "ref-tokens": worker_tokens, "ours-tokens": worker_tokens,
           "speed-run": worker_speed, "server-run": worker_server,
           "census-run": worker_census}  # fmt: skip


def pick_folders(args) -> list[str]:
    if args.folders:
        return args.folders
    exports = R["models"].get("exports", {})
    if exports:
        return [e["folder"] for e in exports.values() if e.get("ok")]
    return sorted(str(p.parent) for p in Path(args.models_dir).glob("*/genai_config.json"))


def main() -> None:
    global OUT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", choices=["all", *PARTS, *WORKERS])
    ap.add_argument("--out", default="cuda_check_out")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--folders", nargs="+", help="model folders (default: the exports)")
    ap.add_argument("--models-dir", default="/tmp/cuda_check_models", help="never under --out")
    ap.add_argument("--tokenizer", default=".gpu/w/tok")
    ap.add_argument("--budget-s", type=float, default=400)
    ap.add_argument("--skip", nargs="*", default=[], choices=list(PARTS))
    ap.add_argument("--server-folder", help="for server and census (default: first preferred)")
    ap.add_argument("--isolate-speed", action="store_true", help="a process per measurement")
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    ap.add_argument("--api", choices=["ours", "ref"], help=argparse.SUPPRESS)
    ap.add_argument("--variants", nargs="+", default=["b1"], help=argparse.SUPPRESS)
    ap.add_argument("--names", nargs="+", default=list(SHAPES), help="shapes for models")
    args = ap.parse_args()
    if args.cmd in WORKERS:
        return WORKERS[args.cmd](args)
    OUT, end = Path(args.out), time.time() + args.budget_s
    part_env(args, end)
    log("env", R["env"])
    save()
    parts = [p for p in PARTS if p not in args.skip] if args.cmd == "all" else [args.cmd]
    for i, part in enumerate(parts):
        now = time.time()
        deadline = now + (end - now) * SHARE[part] / sum(SHARE[p] for p in parts[i:])
        if part != "models":
            args.folders = pick_folders(args)
        if end - now < 10 or (part != "models" and not args.folders):
            R["parts"][part] = "skipped: " + ("no time" if end - now < 10 else "no folders")
            save()
            continue
        log(f"== {part}: {deadline - now:.0f} s; folders {args.folders}")
        try:
            PARTS[part](args, deadline)
            R["parts"][part] = f"done in {time.time() - now:.0f} s"
        except Exception:
            R["parts"][part] = "failed"
            R["errors"].append(f"{part}: {traceback.format_exc()[-1500:]}")
            log(f"{part} failed:\n{traceback.format_exc()}")
        save()
    log(f"total {time.time() - end + args.budget_s:.0f} s; results in {OUT}")


if __name__ == "__main__":
    main()
