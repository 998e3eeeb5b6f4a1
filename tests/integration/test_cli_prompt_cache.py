"""``run --prompt-cache FILE`` on real models: the first run writes FILE, later runs copy the
rows of the longest prefix they share with it, and the greedy text is the text of a run without
the cache. A file that is altered, cut short, foreign or written under another setting is ignored
with a warning (a plain run, then the file is written anew), never used and never a crash.

The model is the shared int4 SmolLM2 (MatMulNBits at accuracy level 4, where a one-token pass
rounds differently: two tokens or more are always run, as without the file). Exact arithmetic
(fp32) is checked logit by logit on every cache layout in ``tests/kv/test_copy_rows.py``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import require_shared

from genai_runtime.cli import main

SYSTEM = (
    "You are a careful agent. Tools: read_file(path) returns a file; write_file(path, text) "
    "writes one; run(cmd) runs a shell command and returns its output; search(query) finds "
    "code."
)
REUSED = re.compile(r"prompt cache: reused (\d+) of (\d+) prompt tokens from ")


def run(capsys, model: Path, task: str, *flags: object) -> tuple[str, str]:
    code = main(["run", str(model), task, "--greedy", "--max-new-tokens", "16",
                 *map(str, flags)])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out, captured.err


def reused(err: str) -> tuple[int, int] | None:
    found = REUSED.search(err)
    return None if found is None else (int(found[1]), int(found[2]))


def test_the_first_run_writes_and_later_runs_reuse_with_the_same_text(capsys, tmp_path):
    model = require_shared("models", "smollm2-135m-instruct-int4")
    prompt = ("--system", SYSTEM)
    alpha, beta = "Task alpha: list the files.", "Task beta: run the tests."
    cache = tmp_path / "prompt.kv"
    want_alpha, _ = run(capsys, model, alpha, *prompt)
    want_beta, _ = run(capsys, model, beta, *prompt)
    assert want_alpha.strip() and want_alpha != want_beta

    first, err = run(capsys, model, alpha, *prompt, "--prompt-cache", cache)
    assert first == want_alpha and reused(err) is None
    written = int(re.search(r"prompt cache: wrote (\d+) prompt tokens", err)[1])
    assert cache.is_file() and written > 40

    again, err = run(capsys, model, alpha, *prompt, "--prompt-cache", cache)
    assert again == want_alpha
    assert reused(err) == (written - 2, written)  # two tokens always run
    assert "prompt tokens: 2 |" in err and "wrote" not in err  # a fitting file is only read

    other, err = run(capsys, model, beta, *prompt, "--prompt-cache", cache)
    assert other == want_beta
    count, total = reused(err)
    assert 30 < count < total - 2  # the shared system prompt, not the task


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flipped":
        data[-100] ^= 0x40  # a byte of the rows: only the checksum sees it
    elif how == "truncated":
        del data[-1000:]
    else:
        data[:] = b"not a prompt cache file at all"
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("how", "why"),
    [
        ("flipped", "checksum mismatch"),
        ("truncated", "truncated or padded"),
        ("garbage", "not a prompt cache file"),
        ("threads", "header space"),  # another setting: another namespace
        ("model", "header space"),  # another model's file
    ],
)
def test_an_unusable_file_is_ignored_with_a_warning_then_rewritten(capsys, tmp_path, how, why):
    model = require_shared("models", "smollm2-135m-instruct-int4")
    task = "Task alpha: list the files."
    cache = tmp_path / "prompt.kv"
    want, _ = run(capsys, model, task, "--system", SYSTEM)
    if how == "model":  # the 2-layer cut of the same model: same rows shape, other weights
        run(capsys, require_shared("models", "smollm2-135m-instruct-int4-2layers"), task,
            "--system", SYSTEM, "--prompt-cache", cache)  # fmt: skip
    else:
        run(capsys, model, task, "--system", SYSTEM, "--prompt-cache", cache)
    flags = ("--threads", 1) if how == "threads" else ()
    if how not in ("threads", "model"):
        _damage(cache, how)
    out, err = run(capsys, model, task, "--system", SYSTEM, "--prompt-cache", cache, *flags)
    assert out == want
    assert f"warning: prompt cache {cache} is not used (" in err and why in err
    assert reused(err) is None and "prompt cache: wrote" in err  # written anew
    out, err = run(capsys, model, task, "--system", SYSTEM, "--prompt-cache", cache, *flags)
    assert out == want and reused(err)[0] > 0 and "warning" not in err


def test_what_the_prompt_cache_cannot_serve_is_said(capsys, tmp_path):
    cache = tmp_path / "folder"
    cache.mkdir()  # a folder where the file should be: read and write both fail, the run goes on
    model = require_shared("models", "smollm2-135m-instruct-int4-2layers")
    out, err = run(capsys, model, "Hello there.", "--prompt-cache", cache)
    assert out.strip() and "is not used (" in err and "could not be written" in err
    code = main(["run", str(model), "--audio", "a.wav", "--prompt-cache", str(cache)])
    assert code == 2 and "--prompt-cache keeps a text prompt's" in capsys.readouterr().err
