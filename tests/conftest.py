"""Shared test fixtures: where ../shared lives, and the real model folders in it.

Tests that need ../shared fail loudly when CI=true and it is missing (CI always has it beside the
checkout); on a developer machine without it they are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _private_validation_cache(tmp_path_factory) -> None:
    """Configs the suite validates are remembered in a folder of its own, not the user's cache
    (one per test session, so every run validates afresh at least once)."""
    os.environ["GENAI_RUNTIME_VALIDATION_CACHE"] = str(tmp_path_factory.mktemp("validated"))


def _shared_root() -> Path:
    env = os.environ.get("GENAI_RUNTIME_SHARED")
    return Path(env) if env else REPO.parent / "shared"


def require_shared(*parts: str) -> Path:
    """Path under ../shared; fails (CI) or skips (elsewhere) when it is missing."""
    path = _shared_root().joinpath(*parts)
    if not path.exists():
        message = f"missing shared test material: {path}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + " (CI=true: ../shared must sit beside the checkout)")
        pytest.skip(message, allow_module_level=True)
    return path


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    return require_shared()


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return require_shared("fixtures", "onnxruntime-genai")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    return require_shared("models", "smollm2-135m-instruct-int4")


@pytest.fixture(scope="session")
def smollm2_2layers_dir() -> Path:
    return require_shared("models", "smollm2-135m-instruct-int4-2layers")


# A system prompt and tool list that prompt-cache tests resend turn after turn.
AGENT_SYSTEM = (
    "You are a careful agent. Tools: read_file(path) returns a file; write_file(path, text) "
    "writes one; run(cmd) runs a shell command and returns its output; search(query) finds "
    "code. Think step by step and call one tool at a time. "
)


@pytest.fixture(scope="session")
def tiny_fp32_folder(tmp_path_factory) -> Path:
    """A tiny random GGUF imported at fp32 (accuracy level 0, a 1024-token context): exact
    arithmetic, where a row's results do not depend on how many rows or tokens a pass runs."""
    gguf_models = pytest.importorskip("gguf_models", reason="needs the gguf extra")
    from genai_runtime.importer import import_gguf

    base = tmp_path_factory.mktemp("tiny-fp32")
    gguf = gguf_models.write_tiny_gguf(
        base / "tiny.gguf", qtype=gguf_models.Q.Q8_0, dims={"ctx": 1024}
    )
    return import_gguf(gguf, base / "model", quant="fp32", accuracy_level=0).out_dir


@pytest.fixture(scope="session")
def gpt2_dir() -> Path:
    return require_shared("fixtures", "onnxruntime-genai", "tiny-random-gpt2-fp32")


def load_golden(name: str) -> dict:
    return json.loads(require_shared("fixtures", "goldens", f"{name}.json").read_text())


@contextlib.contextmanager
def captured_logs(*names: str) -> Iterator[list[str]]:
    """What the named loggers log meanwhile, tracebacks included (uvicorn's loggers do not
    propagate to the root, so ``caplog`` misses them): one string, in the list on exit."""
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(logging.Formatter().format(record))

    handler = Keep(logging.DEBUG)
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    text: list[str] = []
    try:
        yield text
    finally:
        for lg, level in zip(loggers, levels):
            lg.removeHandler(handler)
            lg.setLevel(level)
        text.append("\n".join(records))


def pytest_collection_modifyitems(config, items) -> None:
    """``gpu`` tests run only where onnxruntime has the CUDA provider (onnxruntime-gpu)."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        return
    skip = pytest.mark.skip(reason="needs onnxruntime-gpu and a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
