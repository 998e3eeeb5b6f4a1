"""BOS where the tokenizer config asks for it, so no prompt needs a typed ``<bos>``.

A tiny Gemma 3 folder (imported from a GGUF built here: ``add_bos_token: true``) with Gemma's
chat template, which writes ``{{ bos_token }}`` itself. Side by side with onnxruntime-genai:
``encode`` stays the reference's (no BOS by default); ``encode_prompt`` gives the reference's
``add_special_tokens`` ids for plain text and its default ids for templated text, where the
reference with ``add_special_tokens`` would put BOS twice. ``run`` uses it either way.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from genai_runtime import Model, Tokenizer
from genai_runtime.cli import main
from genai_runtime.importer import import_gguf

G = pytest.importorskip("gguf_gemma3", reason="needs the gguf extra")
ref = pytest.importorskip("onnxruntime_genai")

GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
PLAIN = "hello world"
MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("bos")
    folder = import_gguf(G.write_tiny_gemma3(base / "tiny.gguf"), base / "m", quant="fp32").out_dir
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    assert config["add_bos_token"] is True and config["bos_token"] == "<bos>"
    path.write_text(json.dumps({**config, "chat_template": GEMMA_TEMPLATE}))
    return folder


def test_encode_prompt_adds_bos_once_like_the_reference(gemma):
    ours = Tokenizer(Model(gemma))
    theirs = ref.Tokenizer(ref.Model(str(gemma)))
    bos = ours.bos_token_id
    chat = ours.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert chat == theirs.apply_chat_template(json.dumps(MESSAGES), add_generation_prompt=True)
    ref_plain, ref_chat = (theirs.encode(t).tolist() for t in (PLAIN, chat))
    theirs.update_options(add_special_tokens=True)
    ref_plain_bos, ref_chat_bos = (theirs.encode(t).tolist() for t in (PLAIN, chat))

    assert ours.encode(PLAIN).tolist() == ref_plain and ref_plain[0] != bos  # parity kept
    assert ours.encode_prompt(PLAIN).tolist() == ref_plain_bos == [bos, *ref_plain]
    assert ours.encode_prompt(chat).tolist() == ref_chat and ref_chat[0] == bos
    assert ref_chat_bos[:2] == [bos, bos]  # what switching the option on would do to a chat
    assert ours.encode_prompt("<bos>" + PLAIN).tolist() == [bos, *ref_plain]  # typed: kept once


def test_run_sends_one_bos_plain_or_templated(capsys, gemma):
    tok = Tokenizer(Model(gemma))
    plain = tok.encode(PLAIN).tolist()
    chat = tok.encode(tok.apply_chat_template([{"role": "user", "content": PLAIN}])).tolist()
    assert plain[0] != tok.bos_token_id and chat.count(tok.bos_token_id) == 1
    for args, want in [(["--raw", PLAIN], 1 + len(plain)), ([PLAIN], len(chat))]:
        assert main(["run", str(gemma), *args, "--max-new-tokens", "1"]) == 0
        err = capsys.readouterr().err
        assert int(re.search(r"prompt tokens: (\d+)", err)[1]) == want, (args, err)


NO_BOS_TEMPLATE = GEMMA_TEMPLATE.removeprefix("{{ bos_token }}")


@pytest.fixture(scope="module")
def gemma_no_bos_template(tmp_path_factory, gemma) -> Path:
    """The same folder with a template that does not write BOS, though the tokenizer wants it."""
    import shutil

    folder = tmp_path_factory.mktemp("nobos") / "m"
    shutil.copytree(gemma, folder)
    path = folder / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "chat_template": NO_BOS_TEMPLATE}))
    return folder


def test_every_caller_feeds_the_same_chat_ids(capsys, monkeypatch, gemma_no_bos_template):
    """run, chat, Model.generate, the server and Ray Data turn one user message into the same
    ids: the template's, with the BOS the tokenizer asks for put first once. What each feeds is
    read where the model receives it (the Generator's first append, the decode core's slot)."""
    httpx = pytest.importorskip("httpx")
    from genai_runtime.batching.core import DecodeCore
    from genai_runtime.chat import ChatSession
    from genai_runtime.generator import Generator
    from genai_runtime.integrations.ray.data import BatchPredictor
    from genai_runtime.server import ServerHandle

    folder = gemma_no_bos_template
    fed: dict[str, list[int]] = {}
    caller = ["?"]
    append, place = Generator.append_tokens, DecodeCore.place

    def spy_append(self, tokens):
        fed.setdefault(caller[0], [int(t) for t in np.asarray(tokens).reshape(-1)])
        return append(self, tokens)

    def spy_place(self, row, slot):
        fed.setdefault(caller[0], row.history.array().tolist())
        return place(self, row, slot)

    monkeypatch.setattr(Generator, "append_tokens", spy_append)
    monkeypatch.setattr(DecodeCore, "place", spy_place)

    model = Model(folder)
    tok = Tokenizer(model)
    template_ids = tok.encode(tok.apply_chat_template(MESSAGES)).tolist()
    want = [tok.bos_token_id, *template_ids]
    assert template_ids[0] != tok.bos_token_id  # the template leaves BOS out

    caller[0] = "run"
    assert main(["run", str(folder), MESSAGES[0]["content"], "--max-new-tokens", "1"]) == 0
    capsys.readouterr()
    caller[0] = "chat"
    list(ChatSession(model, max_new_tokens=1, max_length=64).send(MESSAGES[0]["content"]))
    caller[0] = "Model.generate"
    list(model.generate(MESSAGES, max_length=len(want) + 1))
    caller[0] = "Ray Data"
    BatchPredictor(folder, rows=1, max_tokens=1)({"prompt": [MESSAGES[0]["content"]]})
    caller[0] = "server"
    handle = ServerHandle(str(folder), port=0).start()
    try:
        body = {"model": "m", "messages": MESSAGES, "max_tokens": 1}
        reply = httpx.post(handle.url + "/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
    finally:
        handle.stop()
    assert fed == dict.fromkeys(["run", "chat", "Model.generate", "Ray Data", "server"], want)
