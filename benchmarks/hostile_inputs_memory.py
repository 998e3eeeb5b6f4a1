"""Peak memory of hostile model-folder and GGUF inputs (issue 23 items 2 and 8), whole process.

    python benchmarks/hostile_inputs_memory.py [MODEL_DIR] [--runs 3] [--limit-gib 4]
        [--timeout 60] [--case NAME ...]

Each case runs in a child process under an address-space limit (``--limit-gib``) and a time
limit (``--timeout``); printed per case: the outcome (the error's first words, ``ok``, or the
limit it hit), the median peak RSS of the child and its median wall time over ``--runs``.
Baselines ("... ok") run the same code on a harmless input. Run it from an older checkout
(or with ``PYTHONPATH`` pointing at one) for the numbers before a change.

Cases: ``threads`` (``validate`` of MODEL_DIR with ``intra_op_num_threads: 1000000``),
``threads-256`` (the bound), ``validate`` (MODEL_DIR as it is); ``template`` (a chat template
``{{ 'a' * 10**8 }}``), ``template-ok``; ``gguf-block-count`` (``block_count`` 2^31),
``gguf-context`` (``context_length`` 2^40), ``gguf-unused-array`` (a 38 MiB array no code reads),
``gguf-ok``. The GGUF cases need the ``gguf`` extra (they edit the tests' tiny GGUF).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO.parent / "shared" / "models" / "smollm2-135m-instruct-int4-2layers"
CASES = [
    "validate",
    "threads",
    "threads-256",
    "template-ok",
    "template",
    "gguf-ok",
    "gguf-block-count",
    "gguf-context",
    "gguf-unused-array",
]


def _validate(model: Path, threads: int | None) -> str:
    from genai_runtime.cli import main

    folder = Path(tempfile.mkdtemp()) / "m"
    shutil.copytree(model, folder)
    if threads is not None:
        doc = json.loads((folder / "genai_config.json").read_text())
        doc["model"]["decoder"].setdefault("session_options", {})["intra_op_num_threads"] = threads
        (folder / "genai_config.json").write_text(json.dumps(doc))
    return f"validate exit {main(['validate', str(folder)])}"


def _template(source: str) -> str:
    from tokenizers import Tokenizer, models

    import genai_runtime as og

    folder = Path(tempfile.mkdtemp())
    pieces = ["<unk>", *"abcdefghijklmnopqrstuvwxyz"]
    vocab = {p: i for i, p in enumerate(pieces)}
    Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>")).save(
        str(folder / "tokenizer.json")
    )
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": source}))
    text = og.Tokenizer(folder).apply_chat_template([{"role": "user", "content": "Hello"}])
    return f"rendered {len(text)} characters"


def _gguf_file(edit: str) -> str:
    """Write the edited tiny GGUF (in a process of its own: building it is not measured)."""
    sys.path.insert(0, str(REPO / "tests"))
    import gguf_models
    from gguf_header import ARRAY, UINT32, UINT64, RawItems, emit, parse

    folder = Path(tempfile.mkdtemp())
    header = parse(gguf_models.write_tiny_gguf(folder / "tiny.gguf").read_bytes())
    header.kv.update(
        {
            "gguf-ok": {},
            "gguf-block-count": {"llama.block_count": (UINT32, 2**31)},
            "gguf-context": {"llama.context_length": (UINT64, 2**40)},
            "gguf-unused-array": {"junk": (ARRAY, (0, RawItems(38 << 20, bytes(38 << 20))))},
        }[edit]
    )
    (folder / "h.gguf").write_bytes(emit(header))
    return str(folder / "h.gguf")


def _gguf(path: str) -> str:
    from genai_runtime.importer import import_gguf

    import_gguf(path, Path(path).with_name("out"))
    return "imported"


def run_case(name: str, model: Path, given: str | None) -> str:
    cases = {
        "validate": lambda: _validate(model, None),
        "threads": lambda: _validate(model, 1_000_000),
        "threads-256": lambda: _validate(model, 256),
        "template-ok": lambda: _template("{{ messages[0]['content'] }}"),
        "template": lambda: _template("{{ 'a' * 10**8 }}"),
    }
    try:
        return cases[name]() if name in cases else _gguf(given or _gguf_file(name))
    except Exception as exc:  # the outcome is what is measured
        return f"{type(exc).__name__}: {str(exc)[:90]}"


def measure(name: str, args: argparse.Namespace) -> tuple[str, float, float]:
    limit = int(args.limit_gib * 2**30)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    cmd = [sys.executable, __file__, str(args.model), "--child", name]
    if name.startswith("gguf"):
        made = subprocess.run([*cmd[:-2], "--prepare", name], capture_output=True, text=True)
        cmd += ["--input", made.stdout.strip().splitlines()[-1]]
    start = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, preexec_fn=cap)
    deadline = start + args.timeout
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            child.send_signal(signal.SIGKILL)
            _, status, usage = os.wait4(child.pid, 0)
            return f"killed after {args.timeout:.0f} s", usage.ru_maxrss / 1024, args.timeout
        time.sleep(0.05)
    wall = time.perf_counter() - start
    out = (child.stdout.read() or b"").decode(errors="replace").strip().splitlines()
    outcome = out[-1] if out else f"exit status {os.waitstatus_to_exitcode(status)}"
    return outcome, usage.ru_maxrss / 1024, wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", nargs="?", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--limit-gib", type=float, default=4.0)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--case", action="append", choices=CASES)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--prepare", help=argparse.SUPPRESS)
    p.add_argument("--input", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.prepare:
        print(_gguf_file(args.prepare), flush=True)
        return
    if args.child:
        print(run_case(args.child, args.model, args.input), flush=True)
        return
    for name in args.case or CASES:
        runs = [measure(name, args) for _ in range(args.runs)]
        rss = statistics.median(r[1] for r in runs)
        wall = statistics.median(r[2] for r in runs)
        print(f"{name:18s} peak RSS {rss:8.1f} MiB  {wall:6.1f} s  {runs[-1][0]}", flush=True)


if __name__ == "__main__":
    main()
