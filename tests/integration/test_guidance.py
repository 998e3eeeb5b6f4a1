"""Constrained decoding on the real SmolLM2 model: JSON schema, regex and Lark, greedy and sampled.

Ten prompts run as one batch of ten rows (each row has its own grammar matcher), so every row must
end on its own when its grammar completes. Outputs are checked with ``json.loads`` +
``jsonschema``, ``re.fullmatch`` and a hand-written parser of the Lark language.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from conftest import require_shared

import genai_runtime as og
from genai_runtime.cli import main as cli_main
from genai_runtime.errors import ConfigError, GenerationError
from genai_runtime.tokenizer import Tokenizer

pytest.importorskip("llguidance")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
PALETTE = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {
            "type": "array",
            "minItems": 1,
            "maxItems": 2,
            "items": {
                "type": "object",
                "properties": {
                    "label": {"type": "string", "maxLength": 8},
                    "score": {"type": "integer", "minimum": 0, "maximum": 9},
                },
                "required": ["label", "score"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["color", "tags"],
    "additionalProperties": False,
}
DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
LARK = r"""
start: answer " because " reason "."
answer: "yes" | "no"
reason: /[a-z ]{1,30}/
"""
PROMPTS = [
    "Describe a famous scientist.",
    "Who wrote Hamlet?",
    "Tell me about your best friend.",
    "Invent a character for a fantasy novel.",
    "Give me a random person.",
    "Who was the first person on the moon?",
    "Describe a chef.",
    "Name a painter and their age.",
    "Make up a pirate captain.",
    "Who is the main character of a detective story?",
]


@pytest.fixture(scope="module")
def smollm2() -> tuple[og.Model, Tokenizer]:
    model = og.Model(require_shared("models", "smollm2-135m-instruct-int4"))
    return model, Tokenizer(model)


def _batch(tokenizer: Tokenizer, prompts: list[str]) -> np.ndarray:
    texts = [
        tokenizer.apply_chat_template(
            json.dumps([{"role": "user", "content": p}]), add_generation_prompt=True
        )
        for p in prompts
    ]
    return tokenizer.encode_batch(texts)


def _generate(model, tokenizer, kind, data, *, sampled, max_new=72, prompts=PROMPTS):
    ids = _batch(tokenizer, prompts)
    params = og.GeneratorParams(model)
    options = {"max_length": ids.shape[1] + max_new, "batch_size": len(prompts)}
    if sampled:
        options.update(do_sample=True, top_k=40, temperature=0.9, random_seed=7)
    params.set_search_options(**options)
    params.set_guidance(kind, data)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    pad = model.spec.tokens.pad
    texts = []
    for row in range(len(prompts)):
        new = [t for t in generator.get_sequence(row)[ids.shape[1] :].tolist() if t != pad]
        texts.append(tokenizer.decode(np.array(new, np.int32)))
    # Every row stopped because its grammar completed, not because it ran out of room.
    assert generator.token_count() < ids.shape[1] + max_new, texts
    return texts


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("schema", [PERSON, PALETTE], ids=["person", "palette"])
def test_json_schema_output_parses_and_validates(smollm2, schema, sampled):
    model, tokenizer = smollm2
    texts = _generate(model, tokenizer, "json_schema", json.dumps(schema), sampled=sampled)
    for text in texts:
        jsonschema.validate(json.loads(text), schema)
    assert len(set(texts)) > 1  # ten prompts, not one canned answer


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_regex_iso_date(smollm2, sampled):
    model, tokenizer = smollm2
    prompts = [f"On which date did event number {i} happen? Answer with a date." for i in range(10)]
    texts = _generate(model, tokenizer, "regex", DATE, sampled=sampled, max_new=16, prompts=prompts)
    for text in texts:
        assert re.fullmatch(DATE, text), text


def _parses_as_lark_language(text: str) -> bool:
    # start: ("yes" | "no") " because " /[a-z ]{1,30}/ "."
    for answer in ("yes", "no"):
        head = answer + " because "
        if text.startswith(head) and text.endswith("."):
            reason = text[len(head) : -1]
            return 1 <= len(reason) <= 30 and all(c == " " or "a" <= c <= "z" for c in reason)
    return False


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_lark_grammar(smollm2, sampled):
    model, tokenizer = smollm2
    prompts = [f"Is {n} a good idea? Answer yes or no and why." for n in PROMPTS]
    texts = _generate(model, tokenizer, "lark_grammar", LARK, sampled=sampled, prompts=prompts)
    for text in texts:
        assert _parses_as_lark_language(text), text


def test_get_logits_is_raw_and_set_logits_is_still_constrained(smollm2):
    """get_logits() returns the model's scores before the chain; logits given with set_logits()
    still go through the chain, so the grammar holds even when they favour a banned token."""
    model, tokenizer = smollm2
    ids = _batch(tokenizer, ["Pick a date."])
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=ids.shape[1] + 16)
    params.set_guidance("regex", DATE)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    raw = generator.get_logits()[0, 0]
    digits = {tokenizer.to_token_id(d) for d in "0123456789"}
    assert int(np.argmax(raw)) not in digits  # the unconstrained model would not write a digit
    crafted = np.full_like(raw, -10.0)
    crafted[tokenizer.to_token_id("Hello")] = 50.0  # banned by the regex
    crafted[tokenizer.to_token_id("1")] = 0.0
    generator.set_logits(crafted[None, None, :])
    generator.generate_next_token()
    assert int(generator.get_next_tokens()[0]) == tokenizer.to_token_id("1")
    while not generator.is_done():
        generator.generate_next_token()
    text = tokenizer.decode(generator.get_sequence(0)[ids.shape[1] :])
    assert re.fullmatch(DATE, text) and text.startswith("1"), text


def test_rewind_replays_the_grammar(smollm2):
    model, tokenizer = smollm2
    # No chat template: its <|im_end|> is the EOS id, and rewind_to treats a row whose kept
    # tokens contain EOS as finished.
    ids = tokenizer.encode("The first moon landing happened on ")[None, :]
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=ids.shape[1] + 16)
    params.set_guidance("regex", DATE)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    first = generator.get_sequence(0).tolist()
    generator.rewind_to(ids.shape[1] + 2)
    while not generator.is_done():
        generator.generate_next_token()
    assert generator.get_sequence(0).tolist() == first


@pytest.mark.parametrize(
    ("kind", "data", "words"),
    [
        ("json_schema", "{not json", ["json_schema", "not valid JSON"]),
        ("json_schema", '{"type": "strin"}', ["json_schema", "not a valid schema"]),
        ("regex", "[0-9", ["regex", "rejected"]),
        ("lark_grammar", "start: missing_rule", ["lark_grammar", "rejected"]),
        ("xml", "<a/>", ["unknown", "xml"]),
    ],
)
def test_bad_grammar_fails_before_any_token(smollm2, kind, data, words):
    model, _ = smollm2
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=64)
    params.set_guidance(kind, data)
    with pytest.raises(GenerationError) as info:
        og.Generator(model, params)
    for word in words:
        assert word in str(info.value)


@pytest.fixture(scope="module")
def v2_folder(tmp_path_factory, smollm2_2layers_dir) -> Path:
    """A copy of the 2-layer model with its config migrated to v2 (logits chains are v2 only)."""
    folder = tmp_path_factory.mktemp("v2") / "m"
    shutil.copytree(smollm2_2layers_dir, folder, copy_function=shutil.copyfile)
    assert cli_main(["migrate", str(folder), "-o", str(folder / "v2.json")]) == 0
    (folder / "v2.json").replace(folder / "genai_config.json")
    return folder


def _with_chain(folder: Path, chain: list) -> Path:
    doc = json.loads((folder / "genai_config.json").read_text())
    doc.setdefault("generation", {})["logits"] = chain
    (folder / "genai_config.json").write_text(json.dumps(doc))
    return folder


def test_inline_grammar_op_explain_and_bad_chains(v2_folder, capsys):
    chain = [
        {"op": "repetition_penalty", "penalty": 1.1},
        {"op": "grammar", "regex": DATE},
        {"op": "top_k", "k": 20},
        {"op": "argmax"},
    ]
    folder = _with_chain(v2_folder, chain)
    model = og.Model(str(folder))
    tokenizer = Tokenizer(model)
    ids = _batch(tokenizer, ["Pick a date."])
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=ids.shape[1] + 16)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    assert re.fullmatch(DATE, tokenizer.decode(generator.get_sequence(0)[ids.shape[1] :]))

    assert cli_main(["explain", str(folder)]) == 0
    out = capsys.readouterr().out
    assert (
        "decoding chain: RepetitionPenalty(1.1) -> grammar(regex) -> argmax -> "
        "skipped before argmax: top_k(20)" in out
    )

    # A search option that the chain replaces contradicts it when set at run time too.
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=32, top_k=5)
    with pytest.raises(ConfigError) as info:
        og.Generator(model, params)
    assert [p.path for p in info.value.problems] == ["generation.top_k"]

    _with_chain(folder, [{"op": "grammar", "regex": "(("}])
    params = og.GeneratorParams(og.Model(str(folder)))
    params.set_search_options(max_length=32)
    with pytest.raises(ConfigError) as info:
        og.Generator(params.model, params)
    assert [p.path for p in info.value.problems] == ["generation.logits[0].regex"]

    _with_chain(folder, [{"op": "sample"}, {"op": "top_kk", "k": 2}])
    assert cli_main(["validate", str(folder)]) == 1
    err = capsys.readouterr().err
    assert "generation.logits[1]" in err and "after the terminal 'sample'" in err


def test_grammar_argmax_shortcut_equals_masking_then_argmax(smollm2):
    """Greedy skips masking rows whose argmax is allowed; it must pick what masking would."""
    from genai_runtime.decoding.guidance import Grammar

    model, tokenizer = smollm2
    folder = require_shared("models", "smollm2-135m-instruct-int4")
    text = '{"name": "Ada", "age": 36}'
    answer = tokenizer.encode(text).tolist()
    if answer and answer[0] == model.spec.tokens.bos:
        answer = answer[1:]
    make = lambda: Grammar(  # noqa: E731
        "json_schema", json.dumps(PERSON), tokenizer_json=folder / "tokenizer.json",
        vocab_size=model.vocab_size, eos_token_ids=[2], batch_size=2,
    )  # fmt: skip
    fast, slow = make(), make()
    rng = np.random.default_rng(0)
    allowed_hits = 0
    for token in answer:
        logits = rng.standard_normal((2, model.vocab_size)).astype(np.float32)
        logits[0, token] = 9.0  # row 0: the raw argmax is allowed; row 1: almost surely not
        expected = np.argmax(slow(None, logits.copy()), axis=1)
        got = fast.argmax(logits.copy())
        assert got.tolist() == expected.tolist()
        allowed_hits += int(got[0] == token)
        step = np.array([token, token], np.int32)
        fast.commit(step)
        slow.commit(step)
    assert allowed_hits == len(answer)
    assert fast.complete.all() and slow.complete.all()
