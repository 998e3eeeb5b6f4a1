"""Where a decoder's prefill and decode time goes: onnxruntime's own profiler, summed per operator.

    python benchmarks/decode_profile.py FOLDER [--threads 2] [--contexts 55 512 2048]
        [--steps 16] [--config-entry KEY=VALUE ...]
    python benchmarks/decode_profile.py --kernels [--threads 1] [--rows 55 1]

For each context length the folder's model (run by genai_runtime, greedy) reads a prompt of that
many tokens in one prefill, then decodes ``--steps`` tokens; onnxruntime's profiler records every
node. Per phase it prints the time by operator type (MatMulNBits split by its bits and block
size, the op's share of the phase), the host time around the runs (the Python per-token cost:
wall time of ``generate_next_token`` minus the onnxruntime run it made), and the weight and KV
bytes a decode step reads at that context (from the folder's initializers and its KV shape).

``--kernels``: one MatMulNBits node alone (K 1536, N 8960: the 1.5B's ffn_down transposed, its
largest shape) per weight form (bits, block size, zero points, accuracy level), timed at a
prefill's and a decode step's row counts: the form a GGUF's blocks map to sets the kernel speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import genai_runtime as og  # noqa: E402
from genai_runtime.importer.footprint import footprint  # noqa: E402

TEXT = (
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    "    return a\n\n# The sequence grows quickly; each call walks it from the start.\n"
)


def prompt_ids(tokenizer: og.Tokenizer, length: int) -> list[int]:
    ids = list(tokenizer.encode(TEXT))
    return (ids * (length // len(ids) + 1))[:length]


def node_kinds(folder: Path) -> dict[str, str]:
    """Node name -> the label its time is summed under (MatMulNBits by bits and block size)."""
    import onnx

    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    kinds = {}
    for node in model.graph.node:
        label = node.op_type
        if node.op_type == "MatMulNBits":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            label = f"MatMulNBits {attrs.get('bits', 4)}-bit/{attrs.get('block_size')}"
            if "lm_head" in node.input[1]:
                label += " (lm_head)"
        kinds[node.name] = label
    return kinds


def profiled_runs(folder: Path, threads: int, contexts: list[int], steps: int, extra: dict):
    prefix = os.path.join(tempfile.mkdtemp(prefix="decode-profile-"), "ort")
    options = {"intra_op_num_threads": threads, "enable_profiling": prefix, **extra}
    config = og.Config(str(folder))
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    model = og.Model(config)
    tokenizer = og.Tokenizer(model)
    walls = []  # per context: (prefill seconds, [step seconds])
    for length in [32, *contexts]:  # the first is a warm-up, dropped below
        ids = prompt_ids(tokenizer, length)
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=length + steps + 1, do_sample=False)
        gen = og.Generator(model, params)
        t0 = time.perf_counter()
        gen.append_tokens(ids)
        prefill = time.perf_counter() - t0
        step_walls = []
        for _ in range(steps):
            t0 = time.perf_counter()
            gen.generate_next_token()
            step_walls.append(time.perf_counter() - t0)
        walls.append((prefill, step_walls))
        del gen
    kv_per_token = model.pipeline.plan.layout.bytes_per_token(1)  # every layer's keys/values
    paths = [session.end_profiling() for session in model.sessions.values()]
    del tokenizer, model
    path = paths[0]
    return json.loads(Path(path).read_text()), walls[1:], kv_per_token


def split_runs(trace: list[dict]) -> list[tuple[float, dict[str, float]]]:
    """Per model run in time order: its duration (us) and the node time (us) by node name."""
    runs = sorted(
        (e for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run"),
        key=lambda e: e["ts"],
    )
    nodes = sorted((e for e in trace if e.get("cat") == "Node"), key=lambda e: e["ts"])
    out, i = [], 0
    for run in runs:
        end = run["ts"] + run["dur"]
        times: dict[str, float] = defaultdict(float)
        while i < len(nodes) and nodes[i]["ts"] < end:
            event = nodes[i]
            if event["ts"] >= run["ts"] and event["name"].endswith("_kernel_time"):
                times[event["name"][: -len("_kernel_time")]] += event["dur"]
            i += 1
        out.append((float(run["dur"]), dict(times)))
    return out


def by_kind(runs: list[tuple[float, dict[str, float]]], kinds: dict[str, str]):
    total: dict[str, float] = defaultdict(float)
    for _, times in runs:
        for name, us in times.items():
            total[kinds.get(name, name)] += us
    return total


KERNEL_FORMS = [  # (bits, block size, zero points, accuracy level)
    (4, 32, True, 4), (4, 32, False, 4), (4, 64, True, 4), (4, 128, True, 4), (4, 32, True, 0),
    (8, 16, False, 4), (8, 32, False, 4), (8, 64, False, 4), (8, 128, False, 4),
]  # fmt: skip


def matmul_nbits_model(k: int, n: int, bits: int, block: int, zero_points: bool, level: int):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    blocks = k // block
    inits = [
        numpy_helper.from_array(
            rng.integers(0, 256, (n, blocks, block * bits // 8), np.uint8), "B"
        ),
        numpy_helper.from_array((rng.random(n * blocks) * 0.01).astype(np.float32), "S"),
    ]
    if zero_points:
        packed = (n * blocks * bits + 7) // 8
        inits.append(numpy_helper.from_array(np.full(packed, 0x88, np.uint8), "Z"))
    node = helper.make_node("MatMulNBits", ["A", "B", "S", "Z"][: len(inits) + 1], ["Y"],
                            domain="com.microsoft", K=k, N=n, bits=bits, block_size=block,
                            accuracy_level=level)  # fmt: skip
    graph = helper.make_graph(
        [node], "one", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])  # fmt: skip
    return model.SerializeToString()


def kernels(threads: int, rows: list[int], k: int = 1536, n: int = 8960) -> None:
    import numpy as np
    import onnxruntime as ort

    print(f"# MatMulNBits K={k} N={n}, {threads} threads, onnxruntime {ort.__version__}")
    print("| form | " + " | ".join(f"{m} rows: ms (GMAC/s)" for m in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for bits, block, zp, level in KERNEL_FORMS:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        model = matmul_nbits_model(k, n, bits, block, zp, level)
        sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        cells = []
        for m in rows:
            x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
            for _ in range(3):
                sess.run(None, {"A": x})
            times = []
            for _ in range(max(10, 400 // m)):
                t0 = time.perf_counter()
                sess.run(None, {"A": x})
                times.append(time.perf_counter() - t0)
            t = statistics.median(times)
            cells.append(f"{t * 1e3:.2f} ({m * k * n / t / 1e9:.0f})")
        form = f"{bits}-bit/{block}{' zp' if zp else ''}, level {level}"
        print(f"| {form} | " + " | ".join(cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, nargs="?")
    parser.add_argument("--kernels", action="store_true", help="time MatMulNBits forms alone")
    parser.add_argument("--rows", type=int, nargs="+", default=[55, 1])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--contexts", type=int, nargs="+", default=[55, 512, 2048])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--config-entry", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    if args.kernels:
        kernels(args.threads, args.rows)
        return 0
    if args.folder is None:
        parser.error("a model folder, or --kernels")
    entries = dict(item.split("=", 1) for item in args.config_entry)
    extra = entries  # session_options keys holding strings are onnxruntime config entries
    trace, walls, kv_per_token = profiled_runs(
        args.folder, args.threads, args.contexts, args.steps, extra
    )
    runs = split_runs(trace)
    per_context = args.steps  # the first step picks from the prefill's logits: no run of its own
    runs = runs[-per_context * len(args.contexts) :]
    kinds = node_kinds(args.folder)
    weights = footprint(args.folder / "model.onnx").bytes_per_token
    print(f"# {args.folder.name}, {args.threads} threads, entries {entries or 'none'}")
    print(f"weights read per decode step: {weights / 2**20:.1f} MiB")
    for c, length in enumerate(args.contexts):
        chunk = runs[c * per_context : (c + 1) * per_context]
        prefill_wall, step_walls = walls[c]
        for phase, part, wall in (
            ("prefill", chunk[:1], prefill_wall),
            ("decode", chunk[1:], statistics.median(step_walls[1:])),
        ):
            ort_ms = statistics.median(d for d, _ in part) / 1e3
            total = by_kind(part, kinds)
            node_sum = sum(total.values()) or 1.0
            n = len(part)
            head = f"\n## context {length}, {phase}: wall {wall * 1e3:.1f} ms"
            head += f" (onnxruntime run {ort_ms:.1f} ms, host {wall * 1e3 - ort_ms:.2f} ms)"
            if phase == "decode":
                kv = kv_per_token * length
                mib = (weights + kv) / 2**20
                head += f"; reads {weights / 2**20:.0f} + {kv / 2**20:.0f} MiB KV"
                head += f" = {mib / wall / 1024:.1f} GiB/s"
            print(head)
            for label, us in sorted(total.items(), key=lambda kv: -kv[1])[:10]:
                share = us / node_sum
                print(f"  {label:<40} {us / n / 1e3:8.2f} ms  {share:6.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
