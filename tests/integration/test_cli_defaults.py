"""The command line's defaults: ``run`` and ``chat`` sample (the folder's own settings first),
cap new tokens and end a reply that repeats itself, so a first command ends by itself;
``--greedy`` stays the reference's greedy decoding.

The question below looped for minutes under greedy decoding with no cap. The pulled models
(``genai-runtime pull smollm2`` / ``qwen2.5-coder-0.5b``) are checked when this machine has
them; the shared SmolLM2 export runs everywhere.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from genai_runtime import Generator, GeneratorParams, Model, Tokenizer
from genai_runtime.cli import build_parser, main
from genai_runtime.cli.common import cli_search_options
from genai_runtime.config.pulled import pulled_folder
from genai_runtime.decoding.stopping import StopPolicy, StopReason, StopRule, loop_period
from genai_runtime.errors import ConfigError
from genai_runtime.generation_defaults import (
    DEFAULT_SAMPLING,
    SAMPLING_FILE,
    defaults_for,
    recommended_sampling,
)

QUESTION = "Who wrote the novel 'Pride and Prejudice', and in what year was it published?"


def _run(model: str, *flags: str) -> tuple[str, str, float]:
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "genai_runtime", "run", model, QUESTION, *flags],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr, time.monotonic() - start


@pytest.mark.parametrize("name", ["smollm2", "qwen2.5-coder-0.5b"])
def test_the_question_ends_by_itself_and_names_austen_on_the_pulled_model(name):
    if pulled_folder(name) is None:
        pytest.skip(f"{name} is not pulled here (genai-runtime pull {name})")
    for seed in ("1", "2", "3"):
        out, err, seconds = _run(name, "--seed", seed)
        assert seconds < 60, err
        assert "Austen" in out, out
        assert "note: cut at" not in err, err  # ended by itself, not by the cap


def test_the_question_ends_by_itself_on_the_shared_export(smollm2_dir):
    for seed in ("1", "2"):
        _, err, seconds = _run(str(smollm2_dir), "--seed", seed)
        assert seconds < 60, err
        assert "note: cut at" not in err, err
        assert int(err.rsplit("(", 1)[1].split()[0]) < 512, err  # new tokens, under the cap


def test_greedy_stays_the_configs_greedy(capsys, smollm2_2layers_dir):
    """``--greedy`` gives the tokens a Generator gives with the config's own options."""
    assert main(["run", str(smollm2_2layers_dir), "Hello", "--greedy", "--max-new-tokens", "12",
                 "--no-loop-guard"]) == 0  # fmt: skip
    text = capsys.readouterr().out.strip()
    model = Model(str(smollm2_2layers_dir))
    tok = Tokenizer(model)
    ids = tok.encode_chat([{"role": "user", "content": "Hello"}])
    params = GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 12)
    gen = Generator(model, params)
    gen.append_tokens(ids)
    while not gen.is_done():
        gen.generate_next_token()
    assert tok.decode(gen.get_sequence(0)[len(ids) :]).strip() == text


def test_defaults_in_force_come_from_the_folder_first(tmp_path, smollm2_2layers_dir):
    folder = tmp_path / "m"
    shutil.copytree(smollm2_2layers_dir, folder)
    model = Model(str(folder))
    assert defaults_for(model.spec).sampling == DEFAULT_SAMPLING  # greedy config, no record
    (folder / SAMPLING_FILE).write_text(json.dumps({"do_sample": True, "temperature": 0.2,
                                                    "top_p": 0.9, "bos_token_id": 1}))  # fmt: skip
    recorded = defaults_for(Model(str(folder)).spec)
    assert dict(recorded.sampling) == {"do_sample": True, "temperature": 0.2, "top_p": 0.9}
    config = json.loads((folder / "genai_config.json").read_text())
    config["search"] |= {"do_sample": True, "top_k": 5}
    (folder / "genai_config.json").write_text(json.dumps(config))
    assert dict(defaults_for(Model(str(folder)).spec).sampling) == {}  # the config samples

    args = build_parser().parse_args(["run", "m", "hi"])
    assert cli_search_options(args, recorded)["temperature"] == 0.2
    args = build_parser().parse_args(["run", "m", "hi", "--greedy"])
    assert cli_search_options(args, recorded) == {"do_sample": False}
    args = build_parser().parse_args(["run", "m", "hi", "--top-k", "3"])
    assert cli_search_options(args, recorded) == {"top_k": 3, "do_sample": True}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("[1]", "expected a JSON object"),
        ('{"temperature": "hot"}', "generation_config.json.temperature: expected a number"),
        ('{"top_p": 3}', "generation_config.json.top_p: 3 is outside"),
        ('{"do_sample": 1}', "generation_config.json.do_sample: expected true or false"),
        ("{", "cannot be read"),
    ],
)
def test_a_bad_recorded_setting_is_named(tmp_path, doc, message):
    (tmp_path / SAMPLING_FILE).write_text(doc)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("[", r"\[")):
        recommended_sampling(tmp_path)


def test_loop_period_finds_a_repeated_block_and_nothing_else():
    rng = np.random.default_rng(0)
    text = rng.integers(0, 1000, 300)
    assert loop_period(text, 64) == 0
    looped = np.concatenate([text[:50], np.tile([7, 8, 9, 10, 11], 13)])  # 65 tokens of 5
    assert loop_period(looped, 64) == 5
    assert loop_period(looped[:-1], 64) == 5  # 64 tokens: any rotation of the block loops
    assert loop_period(np.concatenate([text[:50], np.tile([7, 8, 9, 10, 11], 12)]), 64) == 0
    long_block = np.concatenate([text[:10], np.tile(text[100:140], 3)])  # 3 copies of 40
    assert loop_period(long_block, 64) == 40
    assert loop_period(np.concatenate([text[:10], np.tile(text[100:140], 2)]), 64) == 0


def test_the_loop_guard_is_one_of_the_rules_reasons():
    rule = StopRule([2], policy=StopPolicy(loop_span=8))
    reply = np.array([5, 6, 5, 6, 5, 6, 5, 6])
    assert rule.check(6, generated=8, length=8, reply=reply) is StopReason.LOOP
    assert rule.check(2, generated=8, length=8, reply=reply) is StopReason.EOS  # EOS first
    assert StopRule([2]).check(6, generated=8, length=8, reply=reply) is None  # policy off
