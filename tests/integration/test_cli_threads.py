"""``--threads N`` on run, chat, bench and serve: each command's model sessions are built with
``intra_op_num_threads = N``, read back from the real onnxruntime sessions. Without it, the
config's value (none in these folders: onnxruntime's own default, 0) stands."""

from __future__ import annotations

import io
import sys

import pytest

import genai_runtime.model as model_module
from genai_runtime.cli import main
from genai_runtime.errors import ConfigError


def _threads(model) -> set[int]:
    return {s.get_session_options().intra_op_num_threads for s in model.sessions.values()}


@pytest.fixture
def built(monkeypatch) -> list:
    """Every Model a command builds (the real class, recorded as it is made)."""
    made: list = []

    class Recorded(model_module.Model):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(model_module, "Model", Recorded)
    return made


@pytest.mark.parametrize("threads", [None, 2])
def test_run_chat_and_bench_build_their_sessions_with_threads(
    smollm2_2layers_dir, built, monkeypatch, capsys, threads
):
    flag = [] if threads is None else ["--threads", str(threads)]
    folder = str(smollm2_2layers_dir)
    assert main(["run", folder, "Hi", "--raw", "--max-new-tokens", "2", *flag]) == 0
    bench = ["--new-tokens", "2", "--runs", "1", "--warmup", "0", "--prompt-tokens", "4"]
    assert main(["bench", folder, *bench, *flag]) == 0
    monkeypatch.setattr(sys, "stdin", io.StringIO("/quit\n"))
    assert main(["chat", folder, *flag]) == 0
    capsys.readouterr()
    assert len(built) == 3
    for model in built:
        assert _threads(model) == {0 if threads is None else threads}


def test_threads_is_checked(smollm2_2layers_dir, capsys):
    assert main(["bench", str(smollm2_2layers_dir), "--threads", "0"]) == 2
    assert "expected an integer between 1 and 256, got 0" in capsys.readouterr().err
    config = model_module.Config(str(smollm2_2layers_dir))
    with pytest.raises(ConfigError, match="between 1 and 256"):
        config.set_threads(True)
    config.set_threads(3)
    assert config.spec.sessions["decoder"].options.intra_op_num_threads == 3


def test_serve_builds_its_sessions_with_threads(smollm2_2layers_dir):
    pytest.importorskip("uvicorn", reason="needs the server extra")
    from genai_runtime.server import ServerHandle

    handle = ServerHandle(str(smollm2_2layers_dir), port=0, threads=2).start()
    try:
        assert _threads(handle.state.engine.model) == {2}
    finally:
        handle.stop()
