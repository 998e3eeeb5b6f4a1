"""The thinking controls on a Qwen3-shaped model: a random-weight Qwen3 checkpoint (per-head q/k
RMSNorm, grouped KV heads; ``tests/hf_models.py``) imported at fp32 by the Hugging Face import,
its tokenizer holding ``<think>`` and ``</think>`` as single tokens as Qwen3's does, behind a
Qwen3-style template (thinking on: the generation prompt opens a block; off: it closes an empty
one). Random weights never close a block by themselves, so every answer here follows a budget."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tool_templates import THINKING

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
pytest.importorskip("llguidance")
H = pytest.importorskip("hf_models")

import json  # noqa: E402

from genai_runtime.importer import import_model  # noqa: E402
from genai_runtime.server import ServerHandle  # noqa: E402

ASK = [{"role": "user", "content": "the theory of the thing"}]
OFF = {"chat_template_kwargs": {"enable_thinking": False}}
ANSWER = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}},
    "required": ["answer"],
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3")
    ckpt = H.write_hf(root / "hf", "qwen3", added_tokens=("<think>", "</think>"))
    folder = import_model(ckpt, root / "fp32", quant="fp32").out_dir
    (folder / "chat_template.jinja").write_text(THINKING, encoding="utf-8")
    handle = ServerHandle(str(folder), port=0).start()
    yield handle, openai.OpenAI(base_url=handle.url + "/v1", api_key="x", max_retries=0)
    handle.stop()


def _ask(served, max_tokens=16, **extra):
    handle, client = served
    return client.chat.completions.create(
        model=handle.state.served_name, messages=ASK, temperature=0, max_tokens=max_tokens,
        logprobs=True, **extra,
    )  # fmt: skip


def _tokens(reply) -> list[str]:
    return [t.token for t in reply.choices[0].logprobs.content]


def _reasoning(message) -> str | None:
    return (message.model_extra or {}).get("reasoning_content")


def test_the_think_tags_are_single_tokens_and_thinking_off_closes_an_empty_block(served):
    handle, _ = served
    tok = handle.state.engine.tokenizer
    assert len(tok.encode("<think>")) == 1 and len(tok.encode("</think>")) == 1
    on, off = _ask(served), _ask(served, extra_body=OFF)
    # The template's difference, token for token: "\n</think>\n\n" closes the empty block.
    closing = len(tok.encode("<think>\n\n</think>\n\n")) - len(tok.encode("<think>\n"))
    assert off.usage.prompt_tokens - on.usage.prompt_tokens == closing
    assert _reasoning(on.choices[0].message) and not on.choices[0].message.content
    assert off.choices[0].message.content and not _reasoning(off.choices[0].message)


@pytest.mark.parametrize("budget", [0, 3, 7])
def test_a_budget_of_n_thinks_n_tokens_then_closes_with_the_one_tag_token(served, budget):
    free = _tokens(_ask(served))
    assert "</think>" not in free  # left alone, these weights think to max_tokens
    reply = _ask(served, extra_body={"thinking_token_budget": budget})
    tokens = _tokens(reply)
    assert tokens[:budget] == free[:budget] and tokens[budget] == "</think>"
    assert len(tokens) == 16 and reply.choices[0].finish_reason == "length"
    message = reply.choices[0].message  # the split falls at the tag, which neither side keeps
    reasoning, content = _reasoning(message) or "", message.content or ""
    assert bool(reasoning.strip()) == (budget > 0) and content.strip()
    assert "think>" not in reasoning and "think>" not in content


def test_a_json_schema_applies_after_the_thinking_only(served):
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER, "strict": True}}
    free = _tokens(_ask(served))
    reply = _ask(served, max_tokens=40, response_format=fmt,
                 extra_body={"thinking_token_budget": 4})  # fmt: skip
    tokens = _tokens(reply)
    assert tokens[:4] == free[:4] and tokens[4] == "</think>"  # the thinking is unconstrained
    assert json.loads(reply.choices[0].message.content)["answer"] in ("yes", "no")
    assert reply.choices[0].finish_reason == "stop"
