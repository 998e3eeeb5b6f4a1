"""A session that did not get the execution provider it asked for is an error, not a CPU run.

onnxruntime builds a session without a requested provider that cannot start (onnxruntime-gpu
with a CUDA library missing, or no GPU): it logs and goes on on the CPU. Here the CPU wheel
shows the same fallback for real: ``get_available_providers`` is made to list the CUDA provider
(only the runtime's own pre-check reads it), so the runtime asks onnxruntime's real
``InferenceSession`` for it, and onnxruntime warns and builds the session on the CPU.
``benchmarks/provider_truth.sh`` shows the same with the real onnxruntime-gpu wheel.
"""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import genai_runtime as og
from genai_runtime.cli import main
from genai_runtime.session import providers

CUDA = "CUDAExecutionProvider"
AZURE = "AzureExecutionProvider"  # the CPU wheel's one provider beside the CPU's
HAS_CUDA = CUDA in ort.get_available_providers()
# onnxruntime's own notice of the fallback (the first test checks it is given).
FALLBACK_WARNING = "ignore:Specified provider 'CUDAExecutionProvider':UserWarning"


@pytest.fixture
def cuda_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime lists the CUDA provider, but cannot give it to a session (the CPU wheel)."""
    if HAS_CUDA:
        pytest.skip("this onnxruntime has the CUDA provider")
    real = ort.get_available_providers
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, *real()])


@pytest.fixture
def preloads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Calls of onnxruntime's ``preload_dlls`` from a fresh process's first session on."""
    calls: list[int] = []
    monkeypatch.setattr(ort, "preload_dlls", lambda: calls.append(1), raising=False)
    providers.preload_libraries.cache_clear()
    yield calls
    providers.preload_libraries.cache_clear()


def _config(folder: Path, provider: str | None) -> og.Config:
    config = og.Config(folder)
    if provider is not None:
        config.clear_providers()
        config.append_provider(provider)
    return config


def _greedy(model: og.Model, new: int = 6) -> list[int]:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=5 + new)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([[1, 504, 3458, 314, 260]], np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return generator.get_sequence(0).tolist()


def test_a_provider_the_session_did_not_get_is_an_error(
    smollm2_2layers_dir: Path, cuda_listed: None, preloads: list[int], recwarn
) -> None:
    with pytest.raises(og.GenaiRuntimeError) as raised:
        og.Model(_config(smollm2_2layers_dir, "cuda"))
    message = str(raised.value)
    assert isinstance(raised.value, og.UnsupportedError)
    assert message.startswith(f"pipeline.sessions.decoder: execution provider {CUDA}")
    assert "libonnxruntime_providers_cuda" in message and "onnxruntime-gpu" in message
    # onnxruntime's own fallback happened: it warned, and built the session anyway.
    assert any(CUDA in str(w.message) for w in recwarn.list)
    assert preloads == [1]
    config = og.Config(smollm2_2layers_dir)
    config.use_device("cuda:1")
    with pytest.raises(og.UnsupportedError, match=f"{CUDA} device_id 1 was requested"):
        og.Model(config)


def test_cpu_sessions_are_untouched(smollm2_2layers_dir: Path, preloads: list[int]) -> None:
    model = og.Model(_config(smollm2_2layers_dir, "cpu"))
    assert [s.get_providers() for s in model.sessions.values()] == [["CPUExecutionProvider"]]
    assert len(_greedy(model)) == 11
    assert preloads == []  # no CUDA libraries loaded for a CPU run


def test_a_provider_onnxruntime_gives_the_session_loads(
    smollm2_2layers_dir: Path, preloads: list[int]
) -> None:
    if AZURE not in ort.get_available_providers():
        pytest.skip("this onnxruntime has no Azure provider")
    model = og.Model(_config(smollm2_2layers_dir, AZURE))
    assert AZURE in model.sessions["decoder"].get_providers()
    assert _greedy(model) == _greedy(og.Model(_config(smollm2_2layers_dir, None)))
    og.Model(_config(smollm2_2layers_dir, AZURE))
    assert preloads == [1]  # once a process


def test_why_not_names_the_library_and_the_package() -> None:
    error = "libcublasLt.so.13: cannot open shared object file: No such file or directory"
    assert providers.missing_library(error) == "libcublasLt.so.13"
    assert providers.missing_library("/x/libfoo.so: invalid ELF header") is None
    cuda = providers.PROVIDER_LIBRARIES[CUDA]
    assert "NVIDIA driver" in cuda.advice("libcuda.so.1")  # the CUDA libraries are there
    assert "pip install 'onnxruntime-gpu[cuda,cudnn]'" in cuda.advice("libcublasLt.so.13")
    if not HAS_CUDA:  # the CPU wheel: no CUDA provider library at all
        assert providers.why_not(CUDA) == (
            "this onnxruntime has no libonnxruntime_providers_cuda.so; "
            "install onnxruntime-gpu in place of onnxruntime"
        )


@pytest.mark.filterwarnings(FALLBACK_WARNING)
@pytest.mark.parametrize(
    "argv",
    [["run", "-p", "hi"], ["bench", "--prompt", "hi"], ["chat"]],
    ids=["run", "bench", "chat"],
)
@pytest.mark.parametrize("listed", [True, False], ids=["fallback", "not-in-build"])
def test_cli_commands_stop_with_the_error_before_generating(
    smollm2_2layers_dir: Path, monkeypatch, capsys, argv: list[str], listed: bool
) -> None:
    if HAS_CUDA:
        pytest.skip("this onnxruntime has the CUDA provider")
    if listed:
        real = ort.get_available_providers
        monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, *real()])
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n"))  # chat would read turns from it
    command, *rest = argv
    rc = main([command, str(smollm2_2layers_dir), *rest, "--device", "cuda"])
    out, err = capsys.readouterr()
    assert rc == 1 and out == ""
    assert err.startswith("error: pipeline.sessions.decoder: execution provider")
    assert CUDA in err and "onnxruntime-gpu" in err and "Traceback" not in err


@pytest.mark.filterwarnings(FALLBACK_WARNING)
def test_serve_stops_when_the_session_did_not_get_its_provider(
    smollm2_2layers_dir: Path, cuda_listed: None, capsys
) -> None:
    result: list[int] = []
    argv = ["serve", str(smollm2_2layers_dir), "--device", "cuda", "--port", "0"]
    thread = threading.Thread(target=lambda: result.append(main(argv)), daemon=True)
    thread.start()
    thread.join(30)
    assert result == [1]
    out, err = capsys.readouterr()
    assert "serving" not in out  # said only once the model is loaded
    assert f"error: pipeline.sessions.decoder: execution provider {CUDA}" in err


def test_serve_command_exits_when_the_model_cannot_load(smollm2_2layers_dir: Path) -> None:
    if HAS_CUDA:
        pytest.skip("this onnxruntime has the CUDA provider: serve would serve")
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "genai_runtime", "serve", str(smollm2_2layers_dir),
         "--device", "cuda", "--port", "0"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 1 and time.monotonic() - start < 30
    assert "serving" not in proc.stdout  # said only once the model is loaded
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: pipeline.sessions.decoder: execution provider 'cuda'")
    assert CUDA in last and "onnxruntime-gpu" in last and "Traceback" not in proc.stderr
