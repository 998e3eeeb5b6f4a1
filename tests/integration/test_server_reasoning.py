"""Reasoning models: ``chat_template_kwargs`` and ``reasoning_effort`` reach the template as it
reads them, and a reply's thinking comes back as ``reasoning_content``, plain and streamed.

No thinking model is pullable here: the 2-layer SmolLM2 weights behind a Qwen3-style template
written below (thinking on unless ``enable_thinking`` is false: the generation prompt then closes
an empty block, as Qwen3's does; otherwise it opens one, so the reply starts in the thinking)."""

from __future__ import annotations

import pytest
from conftest import require_shared
from tool_templates import THINKING, model_with_template

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from genai_runtime.server import ServerHandle  # noqa: E402
from genai_runtime.server.reasoning import ThinkSplitter  # noqa: E402

ASK = [{"role": "user", "content": "What is two plus two?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = model_with_template(
        require_shared("models", "smollm2-135m-instruct-int4-2layers"),
        tmp_path_factory.mktemp("think") / "thinker", THINKING,
    )  # fmt: skip
    handle = ServerHandle(str(folder), port=0).start()
    yield handle, openai.OpenAI(base_url=handle.url + "/v1", api_key="x", max_retries=0)
    handle.stop()


def _ask(served, **extra):
    handle, client = served
    return client.chat.completions.create(
        model=handle.state.served_name, messages=ASK, temperature=0, max_tokens=12, **extra
    )


def test_thinking_on_and_off_change_the_prompt_exactly_as_the_template_says(served):
    handle, _ = served
    tok = handle.state.engine.tokenizer
    on = tok.encode_chat(ASK)
    off = tok.encode_chat(ASK, template_kwargs={"enable_thinking": False})
    assert tok.decode(off).endswith("<think>\n\n</think>\n\n")  # as the template writes
    assert tok.decode(on).endswith("<think>\n")
    assert _ask(served).usage.prompt_tokens == len(on)
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    assert _ask(served, extra_body=kwargs).usage.prompt_tokens == len(off)
    assert _ask(served, reasoning_effort="none").usage.prompt_tokens == len(off)
    assert _ask(served, reasoning_effort="high").usage.prompt_tokens == len(on)


def test_the_thinking_is_reasoning_content_plain_and_streamed(served):
    handle, client = served
    thinking = _ask(served).choices[0].message
    assert thinking.model_extra["reasoning_content"]  # the reply starts inside the block
    assert "<think>" not in (thinking.content or "")
    plain = _ask(served, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    message = plain.choices[0].message
    assert message.content and not (message.model_extra or {}).get("reasoning_content")
    reasoning, content = "", ""
    stream = client.chat.completions.create(
        model=handle.state.served_name, messages=ASK, temperature=0, max_tokens=12, stream=True
    )
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            content += delta.content or ""
    assert reasoning == thinking.model_extra["reasoning_content"]
    assert content == (thinking.content or "")


@pytest.mark.parametrize(
    ("prompt", "reply", "want"),
    [
        ("<|im_start|>assistant\n", "<think>\nplan</think>\n\nFour.",
         [("r", "\nplan"), ("c", "Four.")]),
        ("<|im_start|>assistant\n<think>\n", "plan</think>Four.", [("r", "plan"), ("c", "Four.")]),
        ("<|im_start|>assistant\n", "Four.", [("c", "Four.")]),
        ("<think>\n\n</think>\n\n", "Four.", [("c", "Four.")]),
    ],
)  # fmt: skip
def test_a_streamed_reply_splits_as_the_whole_one(prompt, reply, want):
    def merged(parts):
        out = []
        for kind, text in parts:
            if out and out[-1][0] == kind[0]:
                out[-1] = (kind[0], out[-1][1] + text)
            else:
                out.append((kind[0], text))
        return out

    whole = ThinkSplitter(prompt)
    assert merged(whole.feed(reply) + whole.finish()) == want
    pieces = ThinkSplitter(prompt)
    parts = [p for ch in reply for p in pieces.feed(ch)] + pieces.finish()
    assert merged(parts) == want
