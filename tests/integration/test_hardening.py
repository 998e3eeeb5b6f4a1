"""Issue 13 (hardening) and issue 6 items 5-6 on real models: one Generator shared by threads,
hostile YAML/JSON, max_length past the context, steps after done, wrong-typed arguments,
what validate confirms against the graph and the tokenizer, long values in messages."""

from __future__ import annotations

import functools
import json
import math
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import require_shared

import genai_runtime as og
from genai_runtime.cli import main
from genai_runtime.errors import ConfigError, GenaiRuntimeError, GenerationError, TokenizerError

PROMPT = [504, 1398, 282, 5574, 42, 11977, 28, 21285, 28]  # "The list of fruits: apple, banana,"


def two_layers() -> Path:
    return require_shared("models", "smollm2-135m-instruct-int4-2layers")


@functools.cache
def smollm2_2layers() -> og.Model:
    return og.Model(two_layers())


def _generator(model: og.Model, **options: Any) -> og.Generator:
    params = og.GeneratorParams(model)
    params.set_search_options(**options)
    return og.Generator(model, params)


def variant(tmp_path: Path, edit: Callable[[dict], None], copy: bool = False) -> Path:
    """The 2-layer model's files linked (or copied) into a folder with an edited config.

    Links resolve into ../shared, so loading needs ``root="/"`` (``--root /``); the CLI's run
    has no --root, so its tests copy the files (27 MB).
    """
    folder = tmp_path / "m"
    folder.mkdir()
    for f in two_layers().iterdir():
        if f.name != "genai_config.json":
            if copy:
                shutil.copy(f, folder / f.name)
            else:
                (folder / f.name).symlink_to(f)
    config = json.loads((two_layers() / "genai_config.json").read_text())
    edit(config)
    (folder / "genai_config.json").write_text(json.dumps(config))
    return folder


def validate(capsys, *args: object) -> tuple[int, str]:
    status = main(["validate", *map(str, args)])
    out = capsys.readouterr()
    return status, out.out + out.err


# -- 1. one Generator, two threads -----------------------------------------------------------


def test_two_threads_sharing_a_generator_never_corrupt_it_50_runs() -> None:
    """2 threads x 20 generate_next_token() on one Generator, 50 times: with the per-generator
    lock every run equals the serial 40-token run (before: shape errors or garbled tokens)."""
    model = smollm2_2layers()
    total = len(PROMPT) + 40
    serial = _generator(model, max_length=total, min_length=total)
    serial.append_tokens(PROMPT)
    while not serial.is_done():
        serial.generate_next_token()
    expected = serial.get_sequence(0).tolist()

    failures = []
    for run in range(50):
        shared = _generator(model, max_length=total, min_length=total)
        shared.append_tokens(PROMPT)
        errors: list[BaseException] = []

        def work(shared: og.Generator = shared, errors: list = errors) -> None:
            try:
                for _ in range(20):
                    shared.generate_next_token()
                    shared.get_next_tokens()
            except BaseException as exc:  # collected and reported below
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors or shared.get_sequence(0).tolist() != expected:
            failures.append((run, errors))
    assert failures == []


# -- 3. max_length and the context ------------------------------------------------------------


def test_max_length_past_context_length_is_refused_up_front() -> None:
    params = og.GeneratorParams(smollm2_2layers())
    params.set_search_options(max_length=9000)
    with pytest.raises(GenerationError, match=r"max_length \(9000\).*context_length \(8192\)"):
        og.Generator(smollm2_2layers(), params)


def test_cli_clamps_max_new_tokens_to_the_context(tmp_path: Path, capsys) -> None:
    folder = variant(tmp_path, lambda c: c["model"].update(context_length=24)
                     or c["search"].update(max_length=24), copy=True)  # fmt: skip
    status = main(["run", str(folder), "-p", "Hi", "--raw", "--max-new-tokens", "1000000000"])
    err = capsys.readouterr().err
    assert status == 0, err
    assert "prompt tokens: 1 " in err and "(23 new tokens)" in err  # 1 + 23 = 24


def test_cli_prompt_longer_than_the_context_names_its_length(tmp_path: Path, capsys) -> None:
    folder = variant(tmp_path, lambda c: c["model"].update(context_length=16), copy=True)
    status = main(["run", str(folder), "-p", "word " * 40, "--raw", "--max-new-tokens", "4"])
    err = capsys.readouterr().err
    assert status == 1
    assert "prompt is 41 tokens" in err and "context_length is 16" in err


# -- 4. after is_done() ------------------------------------------------------------------------


def test_generate_after_eos_done_changes_nothing_as_the_reference(tmp_path: Path) -> None:
    """The reference: nothing runs, the sequence stays, next tokens read as pad."""
    folder = variant(tmp_path, lambda c: c["model"].update(eos_token_id=216))
    model = og.Model(folder, root="/")
    generator = _generator(model, max_length=20)
    generator.append_tokens([1, 2, 3, 4, 5])
    while not generator.is_done():
        generator.generate_next_token()
    sequence = generator.get_sequence(0).tolist()
    length = generator._exec.length
    for _ in range(3):
        generator.generate_next_token()
        assert generator.is_done()
        assert generator.get_sequence(0).tolist() == sequence
        assert generator.get_next_tokens().tolist() == [model.spec.tokens.pad]
    assert generator._exec.length == length  # no forward pass ran


# -- 5. wrong types --------------------------------------------------------------------------


def _search(**options: Any) -> Callable[[og.Generator], Any]:
    return lambda g: og.GeneratorParams(g.model).set_search_options(**options)


BAD_CALLS: list[tuple[str, Callable[[og.Generator], Any]]] = [
    ("max_length=inf", _search(max_length=math.inf)),
    ("max_length=nan", _search(max_length=math.nan)),
    ("top_p=nan", _search(top_p=math.nan)),
    ("batch_size=2**40", _search(batch_size=2**40)),
    ("append ragged", lambda g: g.append_tokens([[1, 2], [3]])),
    ("append strings", lambda g: g.append_tokens(["a", "b"])),
    ("append object", lambda g: g.append_tokens(object())),
    ("rewind 1.5", lambda g: g.rewind_to(1.5)),
    ("rewind '1'", lambda g: g.rewind_to("1")),
    ("rewind None", lambda g: g.rewind_to(None)),
    ("get_sequence 'a'", lambda g: g.get_sequence("a")),
    ("get_sequence 0.0", lambda g: g.get_sequence(0.0)),
    ("set_logits ['a']", lambda g: g.set_logits(["a"])),
    ("set_logits ragged", lambda g: g.set_logits([[1.0], [1.0, 2.0]])),
    ("set_model_input 'abc'", lambda g: g.set_model_input("input_ids", "abc")),
    ("set_model_input name 5", lambda g: g.set_model_input(5, np.zeros(1))),
    ("get_output 5", lambda g: g.get_output(5)),
    ("get_input None", lambda g: g.get_input(None)),
    ("Generator(None, p)", lambda g: og.Generator(None, og.GeneratorParams(g.model))),
    ("Generator(m, None)", lambda g: og.Generator(g.model, None)),
    ("GeneratorParams(None)", lambda g: og.GeneratorParams(None)),
    ("Model(None)", lambda g: og.Model(None)),
    ("Model(5)", lambda g: og.Model(5)),
    ("Config(None)", lambda g: og.Config(None)),
    ("overlay 5", lambda g: og.Config(two_layers()).overlay(5)),
    ("overlay deep", lambda g: og.Config(two_layers()).overlay("[" * 100000 + "]" * 100000)),
    ("stream.decode('x')", lambda g: og.Tokenizer(g.model).create_stream().decode("x")),
    ("stream.decode(None)", lambda g: og.Tokenizer(g.model).create_stream().decode(None)),
    ("to_token_id(5)", lambda g: og.Tokenizer(g.model).to_token_id(5)),
    ("template_str=5", lambda g: og.Tokenizer(g.model).apply_chat_template("[]", template_str=5)),
    ("messages deep", lambda g: og.Tokenizer(g.model).apply_chat_template("[" * 100000)),
]  # fmt: skip


@pytest.mark.parametrize(("call",), [pytest.param(c, id=i) for i, c in BAD_CALLS])
def test_wrong_argument_types_raise_genai_runtime_errors(call) -> None:
    generator = _generator(smollm2_2layers(), max_length=32)
    generator.append_tokens(PROMPT)
    with pytest.raises(GenaiRuntimeError):
        call(generator)
    # ... and the generator is still usable: it continues exactly as a fresh one would.
    generator.generate_next_token()
    fresh = _generator(smollm2_2layers(), max_length=32)
    fresh.append_tokens(PROMPT)
    fresh.generate_next_token()
    assert generator.get_sequence(0).tolist() == fresh.get_sequence(0).tolist()


# -- 6. what validate and Model confirm against the graph and the tokenizer -------------------


def test_head_size_the_graph_leaves_symbolic_is_confirmed_by_a_probe_run(tmp_path, capsys):
    folder = variant(tmp_path, lambda c: c["model"]["decoder"].update(head_size=32))
    status, out = validate(capsys, folder, "--root", "/")
    assert status == 1
    assert "model.decoder.head_size = 32" in out and "expected 64" in out


def test_zero_hidden_layers_is_not_taken_as_unset(tmp_path, capsys):
    folder = variant(tmp_path, lambda c: c["model"]["decoder"].update(num_hidden_layers=0))
    status, out = validate(capsys, folder, "--root", "/")
    assert status == 1 and "num_layers" in out and "got 0" in out


def test_vocab_size_disagreeing_with_the_graph(tmp_path, capsys):
    folder = variant(tmp_path, lambda c: c["model"].update(vocab_size=1000))
    status, out = validate(capsys, folder, "--root", "/")
    assert status == 1
    assert "model.vocab_size: 1000 disagrees with the graph" in out and "49152" in out
    with pytest.raises(ConfigError, match=r"model\.vocab_size: 1000"):
        og.Model(folder, root="/")


@pytest.mark.parametrize(
    ("key", "value", "path"),
    [
        ("eos_token_id", 99999, "model.eos_token_id"),
        ("eos_token_id", [2, 49152], "model.eos_token_id[1]"),
        ("bos_token_id", 50000, "model.bos_token_id"),
        ("pad_token_id", 10**9, "model.pad_token_id"),
    ],
)
def test_out_of_vocabulary_token_ids_are_config_errors_at_their_path(
    tmp_path, capsys, key, value, path
):
    """Issue 6 item 5: eos 99999 on a 49152-token graph validated and generated forever."""
    folder = variant(tmp_path, lambda c: c["model"].update({key: value}))
    assert main(["validate", str(folder), "--config-only", "--root", "/"]) == 0  # no graph
    capsys.readouterr()
    status, out = validate(capsys, folder, "--root", "/")
    assert status == 1 and f"{path}: token id" in out and "49152 tokens" in out
    with pytest.raises(ConfigError, match=re.escape(f"{path}: token id")):
        og.Model(folder, root="/")


def test_validate_loads_the_tokenizer_and_compiles_the_chat_template(tmp_path, capsys):
    folder = variant(tmp_path, lambda c: None)
    (folder / "chat_template.jinja").unlink()
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }")
    status, out = validate(capsys, folder, "--root", "/")
    assert status == 1 and "chat template does not compile" in out

    (folder / "chat_template.jinja").unlink()
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": 5}}')
    status, out = validate(capsys, folder, "--root", "/")
    assert status == 1 and "tokenizer.json" in out


# -- 7. long values are quoted short ----------------------------------------------------------


def test_a_huge_file_name_gives_a_short_message_with_its_json_path(tmp_path, capsys):
    name = "x" * 5_000_000
    folder = variant(tmp_path, lambda c: c["model"]["decoder"].update(filename=name))
    status, out = validate(capsys, folder, "--config-only", "--root", "/")
    assert status == 1
    assert "model.decoder.filename" in out and len(out) < 2000
    with pytest.raises(GenaiRuntimeError) as info:
        og.Model("y" * 5_000_000)
    assert len(str(info.value)) < 2000


# -- 9. decode of out-of-range ids; migrate -o over the source --------------------------------


def test_decode_of_out_of_range_ids_skips_them_as_the_reference() -> None:
    """Decision (docs/design/decisions.md): like the reference, an id outside the vocabulary
    contributes no text; an all-empty result stays "" (the reference returns "\\ufffd", a
    documented difference)."""
    tokenizer = og.Tokenizer(smollm2_2layers())
    assert tokenizer.decode([28, 99999, 28]) == ",,"  # the reference gives ",," too
    assert tokenizer.decode([99999]) == ""
    stream = tokenizer.create_stream()
    assert [stream.decode(t) for t in (28, 99999, 28)] == [",", "", ","]  # as the reference


def test_migrate_refuses_to_overwrite_without_force(tmp_path: Path, capsys) -> None:
    folder = variant(tmp_path, lambda c: None)
    source = folder / "genai_config.json"
    before = source.read_text()
    assert main(["migrate", str(folder), "-o", str(source)]) == 1
    assert "is the source config: pass --force" in capsys.readouterr().err
    assert source.read_text() == before
    assert main(["migrate", str(folder), "-o", str(source), "--force"]) == 0
    assert json.loads(source.read_text())["version"] == 2


# -- 8. long generations keep their KV memory lazily mapped ---------------------------------


def test_share_buffer_never_copies_to_grow_and_matches_concat() -> None:
    model = smollm2_2layers()
    shared = _generator(model, max_length=400, min_length=400, past_present_share_buffer=True)
    cache = shared.kv_cache
    shared.append_tokens(PROMPT)
    assert cache.kind == "share-buffer"
    epoch = cache._epoch
    assert cache.capacity == 400  # mapped once for max_length; pages commit as written
    for _ in range(150):
        shared.generate_next_token()
    assert cache._epoch == epoch  # never re-allocated, copied or re-bound
    assert cache.nbytes == (len(PROMPT) + 149) * cache.layout.bytes_per_token(1)

    concat = _generator(model, max_length=400, min_length=400, past_present_share_buffer=False)
    concat.append_tokens(PROMPT)
    for _ in range(150):
        concat.generate_next_token()
    assert concat.get_sequence(0).tolist() == shared.get_sequence(0).tolist()


def test_lazy_buffer_commits_memory_only_as_written() -> None:
    from genai_runtime.kv.share_buffer import lazy_zeros

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    before = rss()
    array = lazy_zeros((1, 4, 65536, 256), np.dtype(np.float32))  # 256 MiB mapped
    assert rss() - before < 16 << 20
    array[:, :, :1024] = 1.0  # 4 MiB written
    assert rss() - before < 32 << 20
    assert float(array[:, :, 1024:].max()) == 0.0
    del array


def test_prompt_longer_than_the_context_is_a_generation_error(tmp_path: Path) -> None:
    folder = variant(tmp_path, lambda c: c["model"].update(context_length=8)
                     or c["search"].update(max_length=8))  # fmt: skip
    model = og.Model(folder, root="/")
    generator = _generator(model)
    with pytest.raises(GenerationError, match="9 tokens"):
        generator.append_tokens(PROMPT)


def test_tokenizer_wrong_types_are_tokenizer_errors() -> None:
    tokenizer = og.Tokenizer(smollm2_2layers())
    for call in (
        lambda: tokenizer.encode(5),
        lambda: tokenizer.decode("abc"),
        lambda: tokenizer.decode([[1, 2], [3]]),
        lambda: tokenizer.encode_batch("abc"),
        lambda: tokenizer.apply_chat_template(5),
    ):
        with pytest.raises(TokenizerError):
            call()
