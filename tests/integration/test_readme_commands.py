"""The fenced blocks of README.md and every page under docs/, checked against behaviour: each
block is run here when it can be (the shared-model command, the API example), else its claims are
checked (commands parse, every flag a synopsis line shows exists, extras and pulled names are
real, paths under ../shared exist). A new block that no check below recognises fails
``test_every_block_is_checked``.

The set-up commands themselves (fresh venv + pip install) are too slow for the suite; CI runs the
test one verbatim (``.ci/run``), and ``tests/unit/test_readme.py`` pins that.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from importlib.metadata import metadata
from pathlib import Path

import pytest
import yaml
from conftest import REPO, _shared_root, require_shared

import genai_runtime as og
from genai_runtime.cli import main
from genai_runtime.config import load
from genai_runtime.importer.catalogue import SOURCES

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
TEXTS = {page.relative_to(REPO).as_posix(): page.read_text(encoding="utf-8") for page in PAGES}
# (page, lang, body) for every fenced block of every page, in page order.
BLOCKS = [
    (page, lang, body)
    for page, text in TEXTS.items()
    for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)
]
EXTRAS = set(metadata("genai_runtime").get_all("Provides-Extra") or ())
FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def command_lines(body: str) -> list[str]:
    """Each ``genai-runtime ...`` command of a block: ``&&`` chains split, comments dropped."""
    out = []
    for line in body.splitlines():
        for part in line.split("&&"):
            part = part.split("  #")[0].strip()
            if part.startswith("genai-runtime"):
                out.append(part)
    return out


def usage(capsys, *argv: str) -> str:
    assert main([*argv, "--help"]) == 0
    return capsys.readouterr().out


def shared_paths(text: str) -> list[str]:
    return sorted(set(re.findall(r"\.\./shared/[\w./-]*\w", text)))


# -- one check per kind of block ------------------------------------------------------------


def is_setup(lang: str, body: str) -> bool:
    return lang == "bash" and "python3 -m venv .venv" in body


def check_setup(body: str, capsys) -> None:
    """Install lines name real extras; the genai-runtime commands after them parse, the pulled
    name is one pull knows, and a command on ../shared runs (in-process, from the checkout)."""
    for extra in re.findall(r'pip install -e "\.\[([\w,]+)\]"', body):
        assert set(extra.split(",")) <= set(EXTRAS), extra
    for command in command_lines(body):
        argv = shlex.split(command)[1:]
        if argv[0] == "pull":
            assert argv[1] in SOURCES, argv
            continue
        if argv[1] in SOURCES:  # runs on what the Get-started pull wrote: parse only here
            assert main([argv[0], "--help"]) == 0
            capsys.readouterr()
            continue
        for path in shared_paths(command):
            require_shared(*Path(path).parts[2:])
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(REPO)  # commands' paths are relative to the checkout, on every page
            code = main(argv)
        out = capsys.readouterr().out
        assert code == 0, command
        if "capital of France" in command:
            assert out.startswith("The capital of France is Paris"), out


def is_synopsis(lang: str, body: str) -> bool:
    return lang == "bash" and "MODEL_DIR" in body


def check_synopsis(body: str, capsys) -> None:
    """Every command exists and every flag a line shows is in that command's --help."""
    for line in body.splitlines():
        line = line.split("  #")[0]
        words = line.split()
        if not words:
            continue
        assert words[0] == "genai-runtime", line
        command = [] if words[1].startswith("-") else [words[1]]
        text = usage(capsys, *command)
        for flag in FLAG.findall(line):
            assert re.search(rf"(?<![\w-]){re.escape(flag)}\b", text), (line, flag)


def is_recipes(lang: str, body: str) -> bool:
    return lang == "bash" and "recipes/" in body


def check_recipes(body: str, capsys) -> None:
    for path in shared_paths(body):
        require_shared(*Path(path).parts[2:])


def is_api_example(lang: str, body: str) -> bool:
    return lang == "python" and 'og.Model("path/to/model")' in body


def check_api_example(body: str, capsys) -> None:
    """The first example, run on the 2-layer model: it streams text."""
    folder = require_shared("models", "smollm2-135m-instruct-int4-2layers")
    exec(body.replace("path/to/model", str(folder)), {})
    assert capsys.readouterr().out.strip()


def is_openai_client(lang: str, body: str) -> bool:
    return lang == "python" and "from openai import OpenAI" in body


def check_openai_client(body: str, capsys) -> None:
    """The served name is the shared model's folder name (tests/integration/test_server.py runs
    the client against it)."""
    name = re.search(r'model="([^"]+)"', body)[1]
    assert (_shared_root() / "models" / name).is_dir() or not _shared_root().exists()


def is_v2_config(lang: str, body: str) -> bool:
    return lang == "json" and '"version": 2' in body


def check_v2_config(body: str, capsys) -> None:
    """Loads (tests/unit/test_readme.py also routes it)."""
    assert json.loads(body)["version"] == 2


def is_decoding_chain(lang: str, body: str) -> bool:
    return lang == "yaml" and "logits:" in body


def check_decoding_chain(body: str, capsys, tmp_path: Path) -> None:
    """The chain example is a valid v2 ``generation`` block: it loads into the v2 example."""
    config = json.loads(next(b for _, lang, b in BLOCKS if is_v2_config(lang, b)))
    config["generation"] = yaml.safe_load(body)["generation"]
    (tmp_path / "genai_config.json").write_text(json.dumps(config))
    spec = load(tmp_path)
    assert spec.generation.max_length == 256


def is_whisper_example(lang: str, body: str) -> bool:
    return lang == "python" and "whisper" in body


def check_whisper_example(body: str, capsys) -> None:
    """Its paths exist and the API it shows is there (tests/integration/test_whisper.py runs it)."""
    for path in shared_paths(body):
        require_shared(*Path(path).parts[2:])
    assert callable(og.Audios.open) and hasattr(og.Generator, "set_inputs")
    assert hasattr(og.Model, "create_multimodal_processor") and hasattr(og.Model, "transcribe")


def is_ray_snippet(lang: str, body: str) -> bool:
    return lang == "python" and ("integrations.ray import" in body or "ray.data.llm" in body)


def check_ray_snippet(body: str, capsys) -> None:
    """It compiles and names what genai_runtime.integrations.ray has; tests/integration/
    test_ray_readme.py runs the ones that need no Ray cluster."""
    compile(body, "<docs snippet>", "exec")
    from genai_runtime.integrations import ray as integration

    for names in re.findall(r"from genai_runtime\.integrations\.ray import (.+)", body):
        for name in names.split(","):
            assert hasattr(integration, name.strip()), name


def is_ray_cluster(lang: str, body: str) -> bool:
    return lang == "bash" and "ray start" in body


def check_ray_cluster(body: str, capsys) -> None:
    """Its genai-runtime command parses: every flag it shows is in ``serve --help``."""
    joined = body.replace("\\\n", " ")
    for command in command_lines(joined):
        words = shlex.split(command, comments=True)
        text = usage(capsys, words[1])
        for flag in FLAG.findall(" ".join(words[2:])):
            assert re.search(rf"(?<![\w-]){re.escape(flag)}\b", text), (command, flag)


def is_adapters_example(lang: str, body: str) -> bool:
    return lang == "python" and "og.Adapters" in body


def check_adapters_example(body: str, capsys) -> None:
    """The calls it shows exist (tests/integration/test_lora.py runs them on real adapters)."""
    assert callable(og.Adapters.load) and callable(og.Adapters.unload)
    assert callable(og.Generator.set_active_adapter)


def is_diagram(lang: str, body: str) -> bool:
    return lang == "" and "─►" in body


def check_diagram(body: str, capsys) -> None:
    """A picture of the data flow: nothing to run."""


CHECKS: list[tuple[Callable[[str, str], bool], Callable[..., None]]] = [
    (is_setup, check_setup),
    (is_synopsis, check_synopsis),
    (is_recipes, check_recipes),
    (is_api_example, check_api_example),
    (is_openai_client, check_openai_client),
    (is_v2_config, check_v2_config),
    (is_decoding_chain, check_decoding_chain),
    (is_whisper_example, check_whisper_example),
    (is_adapters_example, check_adapters_example),
    (is_diagram, check_diagram),
    (is_ray_snippet, check_ray_snippet),
    (is_ray_cluster, check_ray_cluster),
]


def test_every_block_is_checked():
    assert len(BLOCKS) >= 10
    assert {page for page, _, _ in BLOCKS} >= {"README.md", "docs/guide/cli.md"}
    for page, lang, body in BLOCKS:
        matches = [check.__name__ for match, check in CHECKS if match(lang, body)]
        assert len(matches) == 1, (page, lang, body[:200], matches)


@pytest.mark.parametrize(
    "index", range(len(BLOCKS)), ids=[f"{page}-{i}" for i, (page, _, _) in enumerate(BLOCKS)]
)
def test_block(index, capsys, tmp_path):
    _, lang, body = BLOCKS[index]
    check = next(check for match, check in CHECKS if match(lang, body))
    if check is check_decoding_chain:
        check(body, capsys, tmp_path)
    else:
        check(body, capsys)


@pytest.mark.parametrize("page", list(TEXTS))
def test_every_shared_path_a_page_names_exists(page):
    for path in shared_paths(TEXTS[page]):
        if "DIR" not in path:
            require_shared(*Path(path).parts[2:])
