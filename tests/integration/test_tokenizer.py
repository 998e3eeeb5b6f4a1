"""Tokenizer / TokenizerStream on real tokenizer folders: goldens, and side by side with
onnxruntime-genai 0.18.0 (``onnxruntime_genai``) on the same folders."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import load_golden, require_shared
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HfTokenizer
from tokenizers import models, pre_tokenizers

from genai_runtime.errors import TokenizerError
from genai_runtime.tokenizer import Tokenizer, TokenizerStream

FOLDERS = {
    "smollm2": ("models", "smollm2-135m-instruct-int4"),
    "gpt2": ("fixtures", "onnxruntime-genai", "tiny-random-gpt2-fp32"),
    "phi3v": ("fixtures", "onnxruntime-genai", "phi3-v"),
    "mm": ("fixtures", "onnxruntime-genai", "multimodal-decoder-with-input-ids"),
}
# Tokenizers whose vocabulary covers arbitrary text (mm's has only the digits 0-9).
TEXT_TOKENIZERS = ["smollm2", "gpt2", "phi3v"]

TEXTS = [
    "Hello world",
    "hello",
    " hello",
    "What is the capital of France?",
    "It's a beautiful day, isn't it? We'll see.",
    "Once upon a time, in a small village,",
    "def f(x):\n    return x * 2\n",
    "naïve café résumé Straße",
    "héllo 🌍 中文 日本語のテキスト 한국어",
    "emoji 😀👍🏽👨‍👩‍👧 flags 🇫🇷",
    "tabs\tand\nnewlines\n\nend",
    "<|im_start|>user\nhi<|im_end|>",
    "<s> x </s>",
    "<|endoftext|>text<|endoftext|>",
    "<|user|>\nQuestion<|end|>\n<|assistant|>\n",
    "Price: $5.00 (approx.) e-mail: a@b.com",
    "",
    " ",
    "x",
]
# phi3-v only: whitespace runs and a few punctuation pairs are split differently by the
# reference's sentencepiece approximation; we follow `tokenizers` (see the dedicated test).
WHITESPACE_TEXTS = ["    leading", "trailing   ", "a  b   c    d", "\n\n  \n", "  \t  x"]


# ------------------------------------------------------------------------------------------------
# fixtures


def _folder(name: str) -> Path:
    return require_shared(*FOLDERS[name])


def _model_like(folder: Path) -> SimpleNamespace:
    """What our Model will hand to Tokenizer(): model_dir + tokens from genai_config.json."""
    model = json.loads((folder / "genai_config.json").read_text())["model"]
    eos = model.get("eos_token_id")
    eos = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    tokens = SimpleNamespace(bos=model.get("bos_token_id"), eos=eos, pad=model.get("pad_token_id"))
    return SimpleNamespace(model_dir=folder, tokens=tokens)


@pytest.fixture(scope="session")
def og():
    """The reference. Missing it fails under CI=true and skips elsewhere."""
    if os.environ.get("CI", "").lower() == "true":
        import onnxruntime_genai

        return onnxruntime_genai
    return pytest.importorskip("onnxruntime_genai")


_OURS: dict[str, Tokenizer] = {}


def ours(name: str) -> Tokenizer:
    """Our tokenizer for a folder, with the genai_config.json token ids (cached)."""
    if name not in _OURS:
        _OURS[name] = Tokenizer(_model_like(_folder(name)))
    return _OURS[name]


@pytest.fixture(scope="session")
def refs(og):
    cache: dict[str, object] = {}

    def get(name: str):
        if name not in cache:
            cache[name] = og.Tokenizer(str(_folder(name)))
        return cache[name]

    return get


def _stream(tok, ids) -> list[str]:
    stream = tok.create_stream()
    return [stream.decode(int(i)) for i in ids]


def _vocab_facts(name: str) -> tuple[int, list[int], set[int], set[int]]:
    """From tokenizer.json: vocabulary size, added-token ids, special ids, and the ids whose
    bytes contain NUL (the reference's C strings end there, so properties leave them out)."""
    spec = json.loads((_folder(name) / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    added = sorted({a["id"] for a in spec["added_tokens"]})
    special = {a["id"] for a in spec["added_tokens"] if a["special"]}
    nul = {i for piece, i in vocab.items() if "\u0100" in piece or piece == "<0x00>"}
    return max(vocab.values()) + 1, added, special, nul


# ------------------------------------------------------------------------------------------------
# goldens


@pytest.mark.parametrize(
    "golden",
    ["smollm2-int4-chat", "smollm2-int4-chat-batch", "smollm2-int4-plain", "smollm2-int4-penalty"],
)
def test_smollm2_goldens(golden):
    tok = ours("smollm2")
    for run in load_golden(golden)["runs"]:
        if run["templated_prompt"] != run["prompt"]:
            messages = json.dumps([{"role": "user", "content": run["prompt"]}])
            assert tok.apply_chat_template(messages) == run["templated_prompt"]
        assert tok.encode(run["templated_prompt"]).tolist() == run["input_ids"]
        generated = run["output_ids"][len(run["input_ids"]) :]
        # The golden texts skip special tokens: the batch rows carry <|im_end|> pads.
        assert tok.decode(generated) == run["output_text"]
        assert "".join(_stream(tok, generated)) == run["output_text"]


def test_smollm2_batch_golden_is_right_padded():
    tok = ours("smollm2")
    runs = load_golden("smollm2-int4-chat-batch")["runs"]
    batch = tok.encode_batch([r["templated_prompt"] for r in runs])
    width = max(len(r["input_ids"]) for r in runs)
    assert batch.shape == (len(runs), width) and batch.dtype == np.int32
    for row, run in zip(batch, runs, strict=True):
        # get_sequence() returns the padded prompt row followed by the generated tokens
        assert row.tolist() == run["output_ids"][:width]
    assert tok.pad_token_id == 2


@pytest.mark.parametrize("golden", ["gpt2-tiny-single", "gpt2-tiny-batch"])
def test_gpt2_goldens(golden):
    tok = ours("gpt2")
    for run in load_golden(golden)["runs"]:
        generated = run["output_ids"][len(run["input_ids"]) :]
        assert tok.decode(generated) == run["output_text"]


def test_gpt2_batch_golden_replacement_char():
    """' bet\ufffd': token 114 is byte 0xB6, a lone UTF-8 continuation byte. The reference cuts
    the text at the first invalid byte and appends one U+FFFD (the 7 more 114s vanish); its
    stream drops the bad bytes instead."""
    tok = ours("gpt2")
    run = load_golden("gpt2-tiny-batch")["runs"][1]
    generated = run["output_ids"][len(run["input_ids"]) :]
    assert generated == [731] + [114] * 7
    assert tok.decode(generated) == " bet\ufffd" == run["output_text"]
    assert _stream(tok, generated) == [" bet"] + [""] * 7
    assert run["input_ids"] == [7, 8, 195, 731]
    assert load_golden("gpt2-tiny-batch")["runs"][0]["input_ids"][-2:] == [98, 98]  # pad = 98


# ------------------------------------------------------------------------------------------------
# side by side with onnxruntime-genai


@pytest.mark.parametrize("name", list(FOLDERS))
def test_special_ids_match_reference(name, refs):
    tok, ref = ours(name), refs(name)
    assert tok.bos_token_id == ref.bos_token_id
    assert tok.pad_token_id == ref.pad_token_id
    assert isinstance(tok.eos_token_ids, np.ndarray) and tok.eos_token_ids.dtype == np.int32
    assert tok.eos_token_ids.tolist() == ref.eos_token_ids.tolist()


def test_reference_built_from_model_agrees(og):
    """og.Tokenizer(og.Model(path)) is the usual reference form; it matches the folder form."""
    ref = og.Tokenizer(og.Model(str(_folder("gpt2"))))
    tok = ours("gpt2")
    assert (tok.bos_token_id, tok.pad_token_id) == (ref.bos_token_id, ref.pad_token_id) == (98, 98)
    assert tok.eos_token_ids.tolist() == ref.eos_token_ids.tolist()
    for text in TEXTS:
        assert tok.encode(text).tolist() == ref.encode(text).tolist()


@pytest.mark.parametrize("name", TEXT_TOKENIZERS)
def test_encode_decode_match_reference(name, refs):
    tok, ref = ours(name), refs(name)
    texts = TEXTS + ([] if name == "phi3v" else WHITESPACE_TEXTS)
    for text in texts:
        ids = tok.encode(text)
        assert ids.dtype == np.int32 and ids.ndim == 1
        assert ids.tolist() == ref.encode(text).tolist(), text
        assert tok.decode(ids) == ref.decode(ids), text


def test_phi3v_whitespace_runs_follow_tokenizers_library(refs):
    """Where the reference's sentencepiece approximation differs (runs of spaces), we emit what
    `tokenizers` (the model's own tokenizer.json semantics) does; decoding is unaffected."""
    tok, ref = ours("phi3v"), refs("phi3v")
    hf = HfTokenizer.from_file(str(_folder("phi3v") / "tokenizer.json"))
    for text in WHITESPACE_TEXTS:
        assert tok.encode(text).tolist() == hf.encode(text, add_special_tokens=False).ids
        assert tok.decode(tok.encode(text)) == ref.decode(ref.encode(text))


def test_mm_tokenizer_added_token_ids_and_unknown_text(refs):
    """A degenerate fixture: vocab "0".."9" at ids 0-9 and added tokens <unk>=0, <s>=1.
    `tokenizers` renumbers the added tokens; we map them back to the declared ids."""
    tok, ref = ours("mm"), refs("mm")
    for text in ["23", "<s>23", "0123456789", "<unk>", "<s><s>", ""]:
        assert tok.encode(text).tolist() == ref.encode(text).tolist(), text
    for token in ["0", "9", "<s>", "<unk>", "10", "a"]:
        assert tok.to_token_id(token) == ref.to_token_id(token), token
    with pytest.raises(TokenizerError, match="cannot encode"):
        tok.encode("hello")  # the reference returns -1 ids here


@pytest.mark.parametrize("name", TEXT_TOKENIZERS)
def test_encode_batch_and_decode_batch_match_reference(name, refs):
    tok, ref = ours(name), refs(name)
    texts = ["hello world", "a", "héllo 🌍 a longer sentence here", "<|im_start|>x"]
    ours_batch = tok.encode_batch(texts)
    ref_batch = ref.encode_batch(texts)
    assert ours_batch.dtype == np.int32
    assert ours_batch.tolist() == ref_batch.as_numpy().tolist()  # right-padded with pad id
    assert tok.decode_batch(ours_batch) == ref.decode_batch(ref_batch)
    assert tok.decode_batch(ref_batch) == ref.decode_batch(ref_batch)  # og.Tensor accepted
    assert tok.decode_batch(ours_batch.tolist()) == ref.decode_batch(ref_batch)


@pytest.mark.parametrize("name", list(FOLDERS))
def test_to_token_id_matches_reference(name, refs):
    tok, ref = ours(name), refs(name)
    probes = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "<|end|>"]
    probes += ["hello", "Ġhello", "▁hello", "zzzqqq", "", " ", "  ", "a", "\n", "Ċ", "<0x0A>"]
    probes += ["é", "Ã©", "\x80", "0", "9", "\t"]
    for probe in probes:
        assert tok.to_token_id(probe) == ref.to_token_id(probe), probe


@pytest.mark.parametrize("name", list(FOLDERS))
def test_decode_random_ids_matches_reference(name, refs):
    tok, ref = ours(name), refs(name)
    rng = random.Random(7)
    size, specials, _, _ = _vocab_facts(name)
    top = size + 8  # a few ids past the vocabulary too
    for _ in range(400):
        ids = [
            rng.choice(specials) if rng.random() < 0.1 else rng.randrange(-1, top)
            for _ in range(rng.randint(1, 24))
        ]
        expected = ref.decode(np.array(ids, dtype=np.int32))
        got = tok.decode(ids)
        if got == "" and expected == "\ufffd":
            continue  # deliberate: all tokens skipped -> "" (the reference says "\ufffd")
        assert got == expected, ids


@pytest.mark.parametrize("name", list(FOLDERS))
@pytest.mark.parametrize("skip_special", [True, False])
def test_stream_chunks_match_reference(name, skip_special, og):
    tok = Tokenizer(_model_like(_folder(name)))
    ref = og.Tokenizer(str(_folder(name)))
    if not skip_special:
        tok.update_options(skip_special_tokens=False)
        ref.update_options(skip_special_tokens=False)
    rng = random.Random(11)
    size, specials, _, _ = _vocab_facts(name)
    top = size + 4
    ids = [
        rng.choice(specials) if rng.random() < 0.05 else rng.randrange(0, top) for _ in range(3000)
    ]
    assert _stream(tok, ids) == _stream(ref, ids)
    for _ in range(100):  # many fresh streams: the first token has its own rules
        short = ids[rng.randrange(0, 2900) :][: rng.randint(1, 12)]
        assert _stream(tok, short) == _stream(ref, short), short


@pytest.mark.parametrize("name", TEXT_TOKENIZERS)
def test_stream_of_encoded_text_matches_reference(name, refs):
    tok, ref = ours(name), refs(name)
    text = "\n".join(TEXTS) * 20  # long, multilingual, multi-byte characters split across tokens
    ids = ref.encode(text)
    chunks = _stream(tok, ids)
    assert chunks == _stream(ref, ids)
    assert "".join(chunks) == tok.decode(ids) == ref.decode(ids)


def test_stream_waits_for_whole_characters():
    tok = ours("gpt2")
    ids = tok.encode(" 🌍").tolist()
    assert ids == [12520, 234, 235]  # " \xf0\x9f", "\x8c", "\x8d"
    assert _stream(tok, ids) == [" ", "", "🌍"]


def test_stream_sentencepiece_spaces(refs):
    """phi3-v: "▁" is a space; after a skipped special token the leading space is dropped."""
    tok, ref = ours("phi3v"), refs("phi3v")
    ids = [1, 15043, 3186, 32007, 22172, 29871, 22172]
    assert _stream(tok, ids) == ["", "Hello", " world", "", "hello", " ", " hello"]
    assert _stream(tok, ids) == _stream(ref, ids)
    assert tok.decode(ids) == "Hello worldhello  hello"
    assert tok.decode([15043, 3186]) == " Hello world"  # no strip at the start, as the reference


def test_stream_is_constant_work_per_token():
    """Each decode() looks at one new token and at most 3 pending bytes, never the history."""
    tok = Tokenizer.from_dir(_folder("smollm2"))
    calls = []
    original = tok._token_bytes

    def counting(idx, prev_special, skip):
        calls.append(idx)
        return original(idx, prev_special, skip)

    tok._token_bytes = counting
    stream = tok.create_stream()
    ids = tok.encode("héllo 🌍 中文 and some text " * 400).tolist()
    for i, token in enumerate(ids, 1):
        stream.decode(token)
        assert len(calls) == i
        assert len(stream._pending) <= 3


def test_add_special_tokens_option_matches_reference(og):
    """By default encode adds no BOS/EOS (the reference creates its tokenizer with
    add_special_tokens=false). Switched on, BOS follows tokenizer_config add_bos_token, else
    the post_processor, else the tokenizer class (Llama-like)."""
    for name in TEXT_TOKENIZERS:
        tok = Tokenizer(_model_like(_folder(name)))
        ref = og.Tokenizer(str(_folder(name)))
        tok.update_options(add_special_tokens=True)
        ref.update_options(add_special_tokens=True)
        for text in ["hello world", "<s> x", ""]:
            assert tok.encode(text).tolist() == ref.encode(text).tolist(), (name, text)
        tok.update_options(add_special_tokens="0")
        ref.update_options(add_special_tokens="0")
        assert tok.encode("hello").tolist() == ref.encode("hello").tolist()
    phi3v = Tokenizer.from_dir(_folder("phi3v"))
    phi3v.update_options(add_special_tokens=1)
    assert phi3v.encode("hello")[0] == 1


# ------------------------------------------------------------------------------------------------
# property: the stream reassembles the full decode


def _ids_strategy(name: str) -> st.SearchStrategy[list[int]]:
    size, _, special, nul = _vocab_facts(name)
    excluded = nul | special  # special tokens: the stream adds spaces around them (gpt2)
    # ids below 300 hold the single-byte pieces that split multi-byte characters
    any_id = st.one_of(st.integers(0, 300), st.integers(0, size - 1))
    ids = any_id.filter(lambda i: i not in excluded)
    return st.lists(ids, min_size=1, max_size=40)


@pytest.mark.parametrize("name", TEXT_TOKENIZERS)
def test_stream_reassembles_decode_property(name):
    tok = ours(name)

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_ids_strategy(name))
    def check(ids: list[int]) -> None:
        full = tok.decode(ids)
        chunks = _stream(tok, ids)
        joined = "".join(chunks)
        for chunk in chunks:
            assert not any(0xD800 <= ord(c) <= 0xDFFF for c in chunk)  # no lone surrogates
            if "\ufffd" not in full:
                assert "\ufffd" not in chunk  # no character split in the middle
        if "\ufffd" in full:
            # bad bytes: decode stops there with one U+FFFD, the stream skips them
            assert joined.startswith(full[: full.index("\ufffd")])
        else:
            assert joined == full

    check()


# ------------------------------------------------------------------------------------------------
# chat templates


def _tiny_tokenizer_dir(path: Path, config: dict, jinja: str | None = None) -> Path:
    """A folder with a small word-level tokenizer.json, a tokenizer_config.json and maybe a
    chat_template.jinja."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4}
    hf = HfTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.add_special_tokens(["<unk>", "<s>", "</s>"])
    path.mkdir(parents=True, exist_ok=True)
    hf.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    if jinja is not None:
        (path / "chat_template.jinja").write_text(jinja)
    return path


MESSAGES = [{"role": "user", "content": "Hi é <b>"}]


def test_chat_template_matches_reference_on_phi3v(refs):
    tok, ref = ours("phi3v"), refs("phi3v")
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "héllo 🌍"},
    ]
    for gen in (True, False):
        expected = ref.apply_chat_template(json.dumps(conversation), add_generation_prompt=gen)
        assert tok.apply_chat_template(json.dumps(conversation), add_generation_prompt=gen) == (
            expected
        )
        assert tok.apply_chat_template(conversation, add_generation_prompt=gen) == expected


def test_chat_template_variables_match_reference(refs):
    tok, ref = ours("smollm2"), refs("smollm2")
    head = "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|"
    tools = json.dumps([{"name": "f", "description": "d é <b>"}])
    cases = [(head + "{{ tools | tojson }}", {"tools": tools}), (head + "{{ tools }}", {})]
    for template, kwargs in cases:
        expected = ref.apply_chat_template(json.dumps(MESSAGES), template_str=template, **kwargs)
        got = tok.apply_chat_template(json.dumps(MESSAGES), template_str=template, **kwargs)
        assert got == expected
    assert got == "<|im_start|>|<|im_end|>|True|"  # None prints as "", as in the reference


def test_chat_template_errors():
    tok = ours("smollm2")
    with pytest.raises(TokenizerError, match="not valid JSON"):
        tok.apply_chat_template('[{"role": "user", ')
    with pytest.raises(TokenizerError, match="JSON array of objects"):
        tok.apply_chat_template('{"role": "user", "content": "x"}')
    with pytest.raises(TokenizerError, match="raised an error: no system role"):
        tok.apply_chat_template(
            json.dumps(MESSAGES), template_str="{{ raise_exception('no system role') }}"
        )
    with pytest.raises(TokenizerError, match="does not compile"):
        tok.apply_chat_template(json.dumps(MESSAGES), template_str="{% for m in messages %}")
    with pytest.raises(TokenizerError, match="chat template failed: UndefinedError"):
        tok.apply_chat_template(json.dumps(MESSAGES), template_str="{{ nothing.here }}")
    with pytest.raises(TokenizerError, match="chat template failed: SecurityError"):
        tok.apply_chat_template(json.dumps(MESSAGES), template_str="{{ messages.append(1) }}")


def test_no_chat_template_says_how_to_pass_one():
    tok = ours("gpt2")
    with pytest.raises(TokenizerError, match=r"no chat template.*template_str"):
        tok.apply_chat_template(json.dumps(MESSAGES))
    assert tok.apply_chat_template(MESSAGES, template_str="{{ messages[0].content }}") == (
        "Hi é <b>"
    )


def test_chat_template_sources_and_helpers(tmp_path):
    named = [
        {"name": "default", "template": "D:{{ messages[0].content }}"},
        {"name": "tool_use", "template": "T:{{ tools | tojson(indent=1) }}"},
    ]
    config = {
        "bos_token": {"content": "<s>", "special": True},  # AddedToken-dict form
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "chat_template": named,
    }
    tok = Tokenizer.from_dir(_tiny_tokenizer_dir(tmp_path / "named", config))
    assert tok.apply_chat_template(MESSAGES) == "D:Hi é <b>"
    assert tok.apply_chat_template(MESSAGES, tools='[{"n": "é"}]') == 'T:[\n {\n  "n": "é"\n }\n]'
    assert tok.bos_token_id == 1 and tok.eos_token_ids.tolist() == [2]
    assert tok.pad_token_id == 2  # no pad token anywhere: the first eos id

    loops = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{{ bos_token }}{{ m.content }}\n{% endfor %}\n"
        "{{ strftime_now('%Y') | length }}|{{ pad_token }}|{{ unk_token }}"
    )
    folder = _tiny_tokenizer_dir(tmp_path / "jinja", config, jinja=loops)
    tok = Tokenizer.from_dir(folder)  # chat_template.jinja wins over tokenizer_config.json
    two = [*MESSAGES, {"role": "user", "content": "ignored"}]
    assert tok.apply_chat_template(two) == "<s>Hi é <b>\n4||<unk>"

    no_default = {"chat_template": [named[1]]}
    tok = Tokenizer.from_dir(_tiny_tokenizer_dir(tmp_path / "nodefault", no_default))
    with pytest.raises(TokenizerError, match="none named 'default'"):
        tok.apply_chat_template(MESSAGES)


# ------------------------------------------------------------------------------------------------
# construction and argument errors


def test_config_ids_take_precedence_over_tokenizer_config():
    folder = _folder("gpt2")
    plain = Tokenizer.from_dir(folder)  # tokenizer_config.json: <|endoftext|> everywhere
    assert (plain.bos_token_id, plain.eos_token_ids.tolist(), plain.pad_token_id) == (
        50256,
        [50256],
        50256,
    )
    configured = Tokenizer.from_dir(folder, bos_token_id=98, eos_token_ids=[98, 7], pad_token_id=98)
    assert (configured.bos_token_id, configured.eos_token_ids.tolist()) == (98, [98, 7])
    assert configured.encode_batch(["hello world", "a"])[1].tolist() == [64, 98]
    assert Tokenizer(str(folder)).pad_token_id == 50256  # a plain folder path also works


def test_bad_inputs_raise_tokenizer_error(tmp_path):
    with pytest.raises(TokenizerError, match=r"no tokenizer\.json"):
        Tokenizer.from_dir(tmp_path)
    with pytest.raises(TokenizerError, match="model_dir"):
        Tokenizer(object())
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot load"):
        Tokenizer.from_dir(tmp_path)
    tok = ours("smollm2")
    with pytest.raises(TokenizerError, match="must not be empty"):
        tok.encode_batch([])
    with pytest.raises(TokenizerError, match="2-D"):
        tok.decode_batch(np.array([1, 2, 3]))
    with pytest.raises(TokenizerError, match="integers"):
        tok.decode(np.array([1.5]))
    with pytest.raises(TokenizerError, match="Invalid tokenizer option key: foo"):
        tok.update_options(foo="bar")
    with pytest.raises(TokenizerError, match="No options"):
        tok.update_options()
    with pytest.raises(TokenizerError, match="bot_token_id is not defined"):
        _ = tok.bot_token_id
    assert isinstance(TokenizerError("x"), RuntimeError)


def test_decode_accepts_ids_in_any_integer_form():
    tok = ours("smollm2")
    ids = tok.encode("hello world")
    expected = "hello world"
    assert tok.decode(ids) == expected
    assert tok.decode(ids.tolist()) == expected
    assert tok.decode(ids.astype(np.int64)) == expected
    assert tok.decode(ids[None, :]) == expected  # flattened, like the reference
    assert tok.decode([]) == ""
    assert isinstance(tok.create_stream(), TokenizerStream)
    assert tok.to_token_id("<|im_start|>") == 1 and tok.to_token_id("no-such-token") == -1
