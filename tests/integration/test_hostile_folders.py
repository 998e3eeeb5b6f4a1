"""Issue 23 items 2, 5 and 10 on the 2-layer SmolLM2 folder: numeric settings that size a
resource are bounded at their JSON path, chat templates render in a bounded sandbox, a folder's
files are opened only when they resolve inside it, and inputs that gave tracebacks (a port past
65535, a 2,000-level JSON schema, a negative eos id) are clear errors."""

from __future__ import annotations

import json
import os
import shutil
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from conftest import require_shared

import genai_runtime as og
from genai_runtime.cli import main
from genai_runtime.config import load, migrate_document
from genai_runtime.errors import ConfigError, GenerationError, PathEscapeError, TokenizerError

HELLO = [{"role": "user", "content": "Hello"}]


def two_layers() -> Path:
    return require_shared("models", "smollm2-135m-instruct-int4-2layers")


def config_only(tmp_path: Path, doc: dict[str, Any]) -> Path:
    folder = tmp_path / "m"
    folder.mkdir(exist_ok=True)
    (folder / "genai_config.json").write_text(json.dumps(doc))
    return folder


def tiny_tokenizer(folder: Path) -> Path:
    """A 35-token BPE tokenizer (the `tokenizers` library's own files) with a chat template."""
    from tokenizers import Tokenizer, models

    folder.mkdir(parents=True, exist_ok=True)
    pieces = ["<unk>", "<|im_start|>", "<|im_end|>", *"abcdefghijklmnopqrstuvwxyz ,.!HW"]
    tok = Tokenizer(
        models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[], unk_token="<unk>")
    )
    tok.add_special_tokens(pieces[1:3])
    tok.save(str(folder / "tokenizer.json"))
    template = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
    cfg = {"chat_template": template, "eos_token": "<|im_end|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


def _v1() -> dict[str, Any]:
    return json.loads((two_layers() / "genai_config.json").read_text())


def _set(doc: dict, path: list[str], value: Any) -> dict:
    node = doc
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return doc


# -- 2. resource bounds at their JSON path ----------------------------------------------------

SESSION = ["model", "decoder", "session_options"]
BOUNDED = [
    ([*SESSION, "intra_op_num_threads"], 1_000_000, "between 0 and 256"),
    ([*SESSION, "inter_op_num_threads"], 100_000, "between 0 and 256"),
    (["search", "max_length"], 2**30, "between 0 and 16777216"),
    (["model", "context_length"], 2**31 - 1, "between 1 and 16777216"),
    (["search", "batch_size"], 10**6, "between 1 and 4096"),
    (["search", "chunk_size"], 2**31 - 1, "16777216"),
    (["model", "decoder", "num_hidden_layers"], 2**31 - 1, "between 0 and 4096"),
    (["model", "decoder", "head_size"], 2**20, "between 0 and 65536"),
    (["model", "decoder", "sliding_window", "window_size"], 2**30, "between 1 and 16777216"),
    (["model", "eos_token_id"], -5, ">= 0"),
    (["model", "pad_token_id"], -1, ">= 0"),
]


@pytest.mark.parametrize(("path", "value", "expected"), BOUNDED, ids=[p[-1] for p, _, _ in BOUNDED])
def test_resource_settings_are_bounded_at_their_json_path(tmp_path, path, value, expected):
    folder = config_only(tmp_path, _set(_v1(), path, value))
    with pytest.raises(ConfigError) as info:
        load(folder)
    where = ".".join(path)
    assert [p.path for p in info.value.problems] == [where]
    assert expected in info.value.problems[0].message and str(value) in str(info.value)


def test_v2_runtime_threads_are_bounded_too(tmp_path):
    doc = migrate_document(two_layers())
    options = doc["pipeline"]["sessions"]["decoder"].setdefault("session_options", {})
    options["runtime"] = {"intra_op_num_threads": 1_000_000}
    folder = config_only(tmp_path, doc)
    with pytest.raises(ConfigError, match="between 0 and 256, got 1000000") as info:
        load(folder)
    path = "pipeline.sessions.decoder.session_options.runtime.intra_op_num_threads"
    assert [p.path for p in info.value.problems] == [path]


def test_validate_refuses_a_thread_bomb_and_a_negative_eos_before_loading(tmp_path, capsys):
    """Before: validate and run created a million threads (14.6 GiB after 5 min), and eos -5
    validated and ran."""
    doc = _set(_v1(), [*SESSION, "intra_op_num_threads"], 1_000_000)
    folder = config_only(tmp_path, _set(doc, ["model", "eos_token_id"], -5))
    assert main(["validate", str(folder)]) == 1
    err = capsys.readouterr().err
    assert "intra_op_num_threads: expected an integer between 0 and 256, got 1000000" in err
    assert "model.eos_token_id: expected an integer >= 0 or an array of integers, got -5" in err


# -- 2. the chat-template sandbox -------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> og.Tokenizer:
    return og.Tokenizer(tiny_tokenizer(tmp_path_factory.mktemp("tok")))


def _render(tokenizer: og.Tokenizer, template: str, messages=HELLO) -> str:
    return tokenizer.apply_chat_template(messages, template_str=template)


def test_a_template_bomb_is_refused_in_bounded_memory(tokenizer):
    """``{{ 'a' * 10**8 }}`` rendered 100 MB (killed at 3 GiB with bigger factors)."""
    tracemalloc.start()
    try:
        with pytest.raises(TokenizerError, match=r"refused: '\*' would be 100000000 characters"):
            _render(tokenizer, "{{ 'a' * 10**8 }}")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak / 2**20:.1f} MiB"


HOSTILE_TEMPLATES = {
    "doubling": "{% set a = 'aaaaaaaa' %}" + "{% set a = a ~ a %}" * 40 + "{{ a|length }}",
    "namespace": "{% set ns = namespace(s='a') %}{% for i in range(60) %}"
    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "power": "{{ 2 ** (10**9) }}",
    "center": "{{ 'a'|center(10**9) }}",
    "ljust": "{{ 'a'.ljust(1000000000) }}",
    "percent-width": "{{ '%1000000000s' % 'a' }}",
    "percent-star": "{{ '%*s' % (1000000000, 'a') }}",
    "format-width": "{{ '{:>1000000000}'.format('a') }}",
    "format-nested": "{{ '{:>{w}}'.format('a', w=1000000000) }}",
    "replace": "{% set s = 'a' * 100000 %}{{ s.replace('a', s)|length }}",
    "join": "{% set s = 'a' * 100000 %}{{ ([s] * 10000)|join|length }}",
    "print-list": "{% set s = 'a' * 100000 %}{{ [s] * 10000 }}",
    "batch": "{{ [1]|batch(10**9, 0)|list|length }}",
    "indent": "{% set s = 'a\n' * 100000 %}{{ s|indent(100000)|length }}",
    "output": "{% for i in range(100000) %}{{ messages }}{% endfor %}",
}


@pytest.mark.parametrize("template", HOSTILE_TEMPLATES.values(), ids=HOSTILE_TEMPLATES.keys())
def test_operations_on_huge_operands_are_refused(tokenizer, template):
    with pytest.raises(TokenizerError, match=r"chat template refused"):
        _render(tokenizer, template)


def test_lipsum_is_not_offered(tokenizer):
    with pytest.raises(TokenizerError, match="'lipsum' is undefined"):
        _render(tokenizer, "{{ lipsum(10**7) }}")


def test_nested_loops_end_at_the_work_budget(tokenizer, monkeypatch):
    from genai_runtime.tokenizer import sandbox

    monkeypatch.setattr(sandbox, "BASE_CHARS", 1 << 12)  # a small budget keeps this quick
    loops = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    with pytest.raises(TokenizerError, match="more work than its budget"):
        _render(tokenizer, loops)
    block = "{% set x %}{% for i in range(100000) %}aaaaaaaa{% endfor %}{% endset %}{{ x }}"
    with pytest.raises(TokenizerError, match="refused"):
        _render(tokenizer, block)


def test_limits_grow_with_the_input(tokenizer):
    """A 4 MiB message renders: the limit is 1 MiB plus 4x the input."""
    big = [{"role": "user", "content": "x" * (4 << 20)}]
    assert "x" * (4 << 20) in tokenizer.apply_chat_template(big, add_generation_prompt=True)
    with pytest.raises(TokenizerError, match="rendered prompt is over"):
        _render(tokenizer, "{% for i in range(6) %}{{ messages[0]['content'] }}{% endfor %}", big)


# -- 5. symlinks out of the folder ------------------------------------------------------------


def _symlink(link: Path, target: Path) -> None:
    try:
        os.symlink(target, link)
    except (OSError, NotImplementedError):
        pytest.skip("this filesystem cannot create symlinks")


@pytest.fixture
def tokenizer_folder(tmp_path) -> Path:
    folder = tiny_tokenizer(tmp_path / "m")
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET {{ messages }}")
    return folder


@pytest.mark.parametrize(
    "name", ["chat_template.jinja", "tokenizer_config.json", "tokenizer.json", "chat_template.json"]
)
def test_a_folder_file_linked_outside_is_refused(tokenizer_folder, name):
    """Before: a symlinked template put any readable file's text into every chat prompt."""
    if name == "chat_template.json":
        cfg = json.loads((tokenizer_folder / "tokenizer_config.json").read_text())
        cfg.pop("chat_template", None)
        (tokenizer_folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    (tokenizer_folder / name).unlink(missing_ok=True)
    _symlink(tokenizer_folder / name, tokenizer_folder.parent / "secret.txt")
    with pytest.raises(PathEscapeError, match=rf"{name}: .*outside the model folder"):
        og.Tokenizer(tokenizer_folder)
    # An explicit root allows it (for tokenizer.json: then it is not JSON, a TokenizerError).
    try:
        tokenizer = og.Tokenizer.from_dir(tokenizer_folder, root=tokenizer_folder.parent)
    except TokenizerError:
        assert name != "chat_template.jinja"
    else:
        if name == "chat_template.jinja":
            assert "TOP SECRET" in tokenizer.apply_chat_template(HELLO)


def test_links_that_stay_inside_the_folder_are_fine(tokenizer_folder):
    (tokenizer_folder / "templates").mkdir()
    (tokenizer_folder / "templates" / "t.jinja").write_text("<{{ messages[0]['content'] }}>")
    _symlink(tokenizer_folder / "chat_template.jinja", Path("templates") / "t.jinja")
    assert og.Tokenizer(tokenizer_folder).apply_chat_template(HELLO) == "<Hello>"


def test_a_genai_config_linked_outside_is_refused(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    shutil.copy(two_layers() / "genai_config.json", tmp_path / "elsewhere.json")
    _symlink(folder / "genai_config.json", tmp_path / "elsewhere.json")
    with pytest.raises(PathEscapeError, match=r"genai_config\.json: .*outside the model folder"):
        load(folder)
    assert load(folder, root=tmp_path).model.vocab_size == 49152


# -- 10. tracebacks that are now clear errors -------------------------------------------------


def test_serve_port_past_65535_is_a_usage_error(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "none"), "--port", "70000"]) == 2
    assert "--port: expected an integer between 0 and 65535, got 70000" in capsys.readouterr().err


def test_deep_json_schemas_are_generation_errors(tmp_path, capsys):
    """2,000 levels through run --json-schema, 150 through set_guidance: RecursionError before."""
    pytest.importorskip("llguidance")

    def nested(levels: int) -> str:
        return (
            '{"type": "object", "properties": {"a": ' * levels
            + '{"type": "string"}'
            + "}}" * levels
        )

    schema = tmp_path / "deep.json"
    schema.write_text(nested(2000))
    folder = str(two_layers())
    assert main(["run", folder, "-p", "Hi", "--json-schema", str(schema)]) == 1
    assert "json_schema nests deeper than 100 levels" in capsys.readouterr().err
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_guidance("json_schema", nested(150))
    with pytest.raises(GenerationError, match="nests deeper than 100 levels"):
        og.Generator(model, params)
