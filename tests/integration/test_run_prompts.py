"""``genai-runtime run`` as people type it: the prompt as an argument, from stdin or from a file;
the chat template by default; temperature that samples; ``--version``; extras named up front.

In-process (``main``) on the shared SmolLM2 models: the same code path as the console script
without a new interpreter per case.
"""

from __future__ import annotations

import io
import re

import pytest

from genai_runtime import __version__
from genai_runtime.cli import build_parser, main
from genai_runtime.cli.common import search_options

FRANCE = "What is the capital of France?"


def run(capsys, monkeypatch, *args: object, stdin: str | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(["run", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def prompt_tokens(err: str) -> int:
    return int(re.search(r"prompt tokens: (\d+)", err)[1])


def test_instruct_model_answers_through_its_template(capsys, monkeypatch, smollm2_dir):
    code, out, err = run(
        capsys, monkeypatch, smollm2_dir, FRANCE, "--max-new-tokens", 8, "--greedy"
    )
    assert code == 0, err
    assert out.startswith("The capital of France is Paris")
    assert prompt_tokens(err) == 37  # the templated prompt (the default system message too)


def test_prompt_from_argument_stdin_and_file(capsys, monkeypatch, smollm2_2layers_dir, tmp_path):
    """Each way in gives the same templated prompt and so the same answer; --raw sends the bare
    text instead."""
    file = tmp_path / "prompt.txt"
    file.write_text(FRANCE + "\n", encoding="utf-8")
    seen = []
    for args, stdin in [
        ((FRANCE,), None),  # positional
        ((), FRANCE + "\n"),  # piped stdin, its line end dropped
        (("-",), FRANCE),  # '-' reads stdin
        (("-f", file), None),
        (("--raw", FRANCE), None),
    ]:
        code, out, err = run(
            capsys, monkeypatch, smollm2_2layers_dir, *args, "--max-new-tokens", 4, "--greedy",
            stdin=stdin,
        )  # fmt: skip
        assert code == 0, err
        seen.append((out, prompt_tokens(err)))
    assert len(set(seen[:4])) == 1 and seen[0][1] == 37, seen
    assert seen[4][1] == 7  # the bare question's 7 tokens


def test_prompt_usage_errors(capsys, monkeypatch, tmp_path):
    for args, stdin, message in [
        (("m",), "", "run: the prompt is empty"),
        (("m", "hi", "-p", "hi"), None, "run: give the prompt once"),
        (("m", "-f", tmp_path / "absent.txt"), None, "cannot read the prompt from"),
        (("m", "hi", "--raw", "--system", "x"), None, "--system needs the chat template"),
        (("m", "hi", "--greedy", "--do-sample"), None, "not allowed with argument"),
    ]:
        code, _, err = run(capsys, monkeypatch, *args, stdin=stdin)
        assert code == 2 and message in err, (args, err)


def test_temperature_samples_unless_greedy(capsys, monkeypatch, smollm2_2layers_dir):
    def text(*flags: object) -> str:
        code, out, err = run(
            capsys, monkeypatch, smollm2_2layers_dir, "Tell me a story.", "--max-new-tokens", 12,
            *flags,
        )  # fmt: skip
        assert code == 0, err
        return out

    greedy = text("--greedy")
    sampled = [text("--temperature", 0.8, "--seed", seed) for seed in (1, 2)]
    assert sampled[0] != sampled[1] and greedy not in sampled
    assert text("--temperature", 0.8, "--greedy", "--seed", 2) == greedy  # seed 2 sampled apart


@pytest.mark.parametrize(
    ("flags", "do_sample"),
    [
        ([], None),  # the config decides
        (["--temperature", "0.8"], True),
        (["--top-k", "40"], True),
        (["--top-p", "0.9"], True),
        (["--temperature", "0"], None),  # greedy (temperature 0 picks greedy decoding)
        (["--temperature", "0", "--top-k", "40"], None),
        (["--temperature", "0.8", "--greedy"], False),
        (["--do-sample"], True),
    ],
)
def test_sampling_rule(flags, do_sample):
    args = build_parser().parse_args(["run", "m", "hi", *flags])
    assert search_options(args).get("do_sample") is do_sample


def test_help_states_the_sampling_rule_and_version(capsys):
    assert main(["run", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--temperature above 0, --top-p or --top-k turn sampling on" in help_text
    assert "unless --greedy is given" in help_text
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"genai-runtime {__version__}"


def test_missing_extras_are_named_before_the_model_loads(capsys, monkeypatch, tmp_path):
    """With the module absent (as on a base install), each command names its extra first: the
    model path here does not exist, so any later step would have failed differently."""
    nowhere = tmp_path / "nowhere"
    cases = [
        ("llguidance", ["run", nowhere, "hi", "--regex", "a+"], '"constrained" extra'),
        ("soundfile", ["run", nowhere, "--audio", "x.wav"], '"audio" extra'),
        ("uvicorn", ["serve", nowhere], '"server" extra'),
    ]
    for module, argv, extra in cases:
        with monkeypatch.context() as patch:
            patch.setitem(__import__("sys").modules, module, None)  # "not installed"
            assert main([str(a) for a in argv]) == 1
        err = capsys.readouterr().err
        assert extra in err and f'pip install "genai_runtime[{extra.split(chr(34))[1]}]"' in err
        assert "nowhere" not in err
