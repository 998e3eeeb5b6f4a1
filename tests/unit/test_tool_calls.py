"""Tool calling without a model: the request's tool fields (400s naming the field), the call
parser (whole or streamed in any cuts, the same pieces), the call formats, what a template is
given, and how a template is probed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conftest import require_shared
from tool_templates import BARE_JSON, NO_SYSTEM, TAGGED

from genai_runtime.server.json_schemas import closed, rerooted
from genai_runtime.server.protocol import APIError, parse_chat
from genai_runtime.server.tool_calls import (
    CALL_FORMATS,
    CallSplitter,
    ToolCall,
    split_reply,
    tag_tokens,
)
from genai_runtime.server.tool_prompt import (
    ToolTemplate,
    check_reaches,
    probe,
    template_input,
)
from genai_runtime.tokenizer.templates import ChatTemplates

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
USER = {"role": "user", "content": "Weather in Paris?"}


def _body(**fields):
    return {"model": "m", "messages": [USER], "tools": [WEATHER, ADD], **fields}


def _param(body) -> str:
    with pytest.raises(APIError) as info:
        parse_chat(body)
    assert info.value.status == 400
    return info.value.param


def test_tool_fields_are_checked_and_a_bad_one_is_a_400_naming_it():
    parsed = parse_chat(_body(tool_choice={"type": "function", "function": {"name": "add"}}))
    tools = parsed.tools
    assert tools.choice == "function" and tools.named == "add" and tools.parallel
    assert [t.name for t in tools.callable] == ["add"] and tools.constrained
    assert tools.definitions()[0] == WEATHER  # what the template receives (HF convention)
    assert parse_chat(_body()).tools.choice == "auto"
    assert parse_chat({"model": "m", "messages": [USER]}).tools is None
    assert not parse_chat(_body(tool_choice="none")).tools.calls_allowed

    fn = WEATHER["function"]
    cases = [
        ({"tools": {"a": 1}}, "tools"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
        ({"tools": [WEATHER, {"type": "function", "function": {"name": "bad name!"}}]},
         "tools[1].function.name"),
        ({"tools": [{"type": "function", "function": {**fn, "parameters": {"type": "nope"}}}]},
         "tools[0].function.parameters"),
        ({"tools": [{"type": "function", "function": {**fn, "parameters": {"type": "array"}}}]},
         "tools[0].function.parameters"),
        ({"tools": [{"type": "function", "function": {**fn, "returns": {}}}]},
         "tools[0].function.returns"),
        ({"tools": [{"type": "function", "function": {**fn, "description": 3}}]},
         "tools[0].function.description"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        ({"tools": [WEATHER] * 129}, "tools"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "missing"}}},
         "tool_choice.function.name"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"functions": [fn]}, "functions"),
        ({"tools": [{"type": "function", "function": {**fn, "description": "\ud800"}}]},
         "tools[0].function.description"),
    ]  # fmt: skip
    for fields, param in cases:
        assert _param(_body(**fields)) == param, fields


CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip


def test_tool_messages_are_checked_and_kept_in_the_template_convention():
    messages = [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    parsed = parse_chat(_body(messages=messages))
    call = parsed.messages[1]["tool_calls"][0]
    assert call["function"]["arguments"] == {"city": "Paris"}  # parsed, as templates expect
    assert parsed.messages[2] == {
        "role": "tool", "content": "sunny", "tool_call_id": "call_1", "name": "get_weather"
    }  # fmt: skip

    def bad_call(**change):
        return {**CALL, **change}

    cases = [
        ([USER, {"role": "user", "content": "x", "tool_calls": [CALL]}], "messages[1].tool_calls"),
        ([USER, {"role": "assistant", "tool_calls": [bad_call(id=7)]}],
         "messages[1].tool_calls[0].id"),
        ([USER, {"role": "assistant", "tool_calls": [
            bad_call(function={"name": "get_weather", "arguments": "{not json"})]}],
         "messages[1].tool_calls[0].function.arguments"),
        ([USER, {"role": "assistant", "tool_calls": [
            bad_call(function={"name": "get_weather", "arguments": "[1]"})]}],
         "messages[1].tool_calls[0].function.arguments"),
        ([USER, {"role": "tool", "tool_call_id": "call_1", "content": "x"}],
         "messages[1].tool_call_id"),
        ([USER, {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "content": "x"}],
         "messages[2].tool_call_id"),
    ]  # fmt: skip
    for messages, param in cases:
        assert _param(_body(messages=messages)) == param, messages


NAMES = {"get_weather", "add"}
REPLIES = [
    "Hello there\n",
    "  plain text, no call ",
    'I will check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n',
    '<tool_call>\n{"name": "unknown", "arguments": {}}\n</tool_call> stays text',
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    '[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "add", "parameters": '
    '{"a": 2}}] and words after',
    '{"a": 1} is JSON but not a call',
    '<tool_call>\n{"name": "add", "arguments": {"a": 1}}',  # ended before the closing tag
    "a tail that looks like <tool_ca",
    "a <tool_call>{broken</tool_call> b",
    # Markdown fences: Qwen2.5-Coder-1.5B writes its calls in one under tool_choice auto.
    '```json\n{\n  "name": "get_weather",\n  "arguments": {"city": "Paris"}\n}\n```',
    '  ```\n{"name": "add", "arguments": {"a": 3}}\n```\nDone.',
    '```python\nprint({"name": "add"})\n```',
    '```json\n{"a": 1}\n```',
    "``",
]


# Qwen2.5's template shows the call format in doubled braces ({{"name": ...}}); its 1.5B copies
# them under tool_choice auto, and such a reply was dropped whole (neither content nor a call).
DOUBLED = [
    '{{"name": "get_weather", "arguments": {"city": "Paris"}}}',
    '<tool_call>\n{{"name": "add", "arguments": {"a": 1}}}\n</tool_call>',
    '```json\n{{ "name": "add", "arguments": {"a": 2} }}\n```\nDone.',
    '{{"a": 1}} is no call',
    '<tool_call>\n{{"name": "add", "arguments": {"a": 1}}} and more\n</tool_call>',
]


def _shape(pieces):
    return [p if isinstance(p, str) else (p.name, json.loads(p.arguments)) for p in pieces]


def test_replies_split_into_content_and_calls():
    got = [_shape(split_reply(text, NAMES)) for text in REPLIES]
    assert got[0] == ["Hello there\n"] and got[1] == ["  plain text, no call "]
    assert got[2] == ["I will check.", ("get_weather", {"city": "Paris"}), ("add", {"a": 1})]
    assert got[3] == [REPLIES[3]] and got[6] == [REPLIES[6]] and got[9] == [REPLIES[9]]
    assert got[4] == [("get_weather", {"city": "Paris"})]
    assert got[5] == [("get_weather", {"city": "Oslo"}), ("add", {"a": 2}), "and words after"]
    assert got[7] == [("add", {"a": 1})] and got[8] == [REPLIES[8]]
    assert got[10] == [("get_weather", {"city": "Paris"})]
    assert got[11] == [("add", {"a": 3}), "Done."]
    assert got[12:] == [[text] for text in REPLIES[12:]]  # code, JSON that is no call, a tick
    one = split_reply(REPLIES[2], NAMES, parallel=False)
    assert _shape(one) == ["I will check.", ("get_weather", {"city": "Paris"})]
    call = one[1]
    assert isinstance(call, ToolCall) and call.id.startswith("call_") and len(call.id) == 29
    assert call.as_openai()["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_a_call_in_doubled_braces_is_a_call():
    got = [_shape(split_reply(text, NAMES)) for text in DOUBLED]
    assert got[0] == [("get_weather", {"city": "Paris"})]
    assert got[1] == [("add", {"a": 1})]
    assert got[2] == [("add", {"a": 2}), "Done."]
    assert got[3:] == [[text] for text in DOUBLED[3:]]  # no call, or not one call alone


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(REPLIES + DOUBLED), st.lists(st.integers(0, 200), max_size=8))
def test_a_streamed_reply_splits_as_the_whole_one(text, cuts):
    splitter, pieces, at = CallSplitter(NAMES), [], 0
    for cut in [*sorted({min(c, len(text)) for c in cuts}), len(text)]:
        pieces += splitter.feed(text[at:cut])
        at = cut
    pieces += splitter.finish()
    merged = []
    for p in pieces:
        if isinstance(p, str) and merged and isinstance(merged[-1], str):
            merged[-1] += p
        else:
            merged.append(p)
    assert _shape(merged) == _shape(split_reply(text, NAMES))


def test_call_formats_write_what_they_parse_and_schemas_close_objects():
    calls = [{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "add",
             "arguments": {}}]  # fmt: skip
    for name, fmt in CALL_FORMATS.items():
        written = fmt.write(calls)
        assert _shape(split_reply(written, NAMES)) == [
            ("get_weather", {"city": "Rome"}), ("add", {})
        ], name  # fmt: skip
        grammar = fmt.grammar([_tool()], parallel=True)
        assert grammar.startswith("start: ") and "%json" in grammar
    assert CALL_FORMATS["json"].write(calls[:1]) == (
        '{"name": "get_weather", "parameters": {"city": "Rome"}}'
    )
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {}}},
              "allOf": [{"properties": {"b": {}}}]}  # fmt: skip
    shut = closed(schema)
    assert shut["additionalProperties"] is False
    assert shut["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in shut["allOf"][0]  # never inside a combinator
    jsonschema.validate({"a": {}}, shut)


def test_tags_the_tokenizer_keeps_whole_are_forced_as_tokens(tmp_path):
    """Qwen2.5's tokenizer has ``<tool_call>`` as an added token (not special): it writes the tag
    as that one token, which llguidance reads as special, never as the tag's text, so a grammar
    spelling the tag out refuses the model's own call. SmolLM2's tokenizer with the two tags added
    the same way: the grammar names them by id and accepts the call as the tokenizer writes it."""
    llguidance = pytest.importorskip("llguidance")
    tokenizers = pytest.importorskip("tokenizers")
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    from genai_runtime.decoding.guidance import load_tokenizer

    doc = json.loads(require_shared("models", "smollm2-135m-instruct-int4", "tokenizer.json")
                     .read_text(encoding="utf-8"))  # fmt: skip
    plain = tokenizers.Tokenizer.from_str(json.dumps(doc))
    assert tag_tokens(lambda t: plain.encode(t, add_special_tokens=False).ids) == {}
    size = plain.get_vocab_size()
    for i, tag in enumerate(("<tool_call>", "</tool_call>")):
        doc["added_tokens"].append({"id": size + i, "content": tag, "single_word": False,
                                    "lstrip": False, "rstrip": False, "normalized": False,
                                    "special": False})  # fmt: skip
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    hf = tokenizers.Tokenizer.from_file(str(path))
    tags = tag_tokens(lambda t: hf.encode(t, add_special_tokens=False).ids)
    assert tags == {"<tool_call>": size, "</tool_call>": size + 1}

    fmt = CALL_FORMATS["tagged"]
    grammar = fmt.grammar([_tool()], False, tags)
    matcher = llguidance.LLMatcher(load_tokenizer(path, size + 2, [2]), grammar)
    mask = allocate_token_bitmask(1, size + 2)
    ids = hf.encode(fmt.write([{"name": "get_weather", "arguments": {"city": "Rome"}}]),
                    add_special_tokens=False).ids  # fmt: skip
    assert ids[0] == size and ids[-1] == size + 1
    for token in ids:
        fill_next_token_bitmask(matcher, mask, 0)
        assert (int(mask[0, token >> 5]) >> (token & 31)) & 1, token  # allowed
        assert matcher.consume_token(token), matcher.get_error()
    assert matcher.is_accepting()


def _tool():
    return parse_chat(_body()).tools.tools[0]


def _render(source: str):
    templates = ChatTemplates({"default": source}, Path("."))

    def render(messages, tools=None, add_generation_prompt=True):
        return templates.render(
            messages, template_str=None, tools=tools,
            add_generation_prompt=add_generation_prompt, special_text={},
        )  # fmt: skip

    return render


SMOLLM2_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_templates_are_probed_by_what_they_render():
    assert probe(_render(TAGGED)) == ToolTemplate(native=True, format="tagged")
    assert probe(_render(BARE_JSON)) == ToolTemplate(native=True, format="json")
    assert probe(_render(SMOLLM2_LIKE)) == ToolTemplate(native=False, format="generic")
    assert probe(_render("{{ raise_exception('no tools') }}")).format == "generic"


def test_a_template_without_tools_gets_them_in_the_generic_form():
    messages = parse_chat(_body(messages=[
        {"role": "system", "content": "Be brief."},
        USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL, {**CALL, "id": "call_2"}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "21 C"},
    ])).messages  # fmt: skip
    request = parse_chat(_body(tool_choice="required")).tools
    generic = ToolTemplate(native=False, format="generic")
    given_ = template_input(messages, request, generic)
    assert given_.tools is None
    system, _, call, results = given_.messages
    assert system["content"].startswith("Be brief.\n\nYou can call these functions")
    assert json.dumps(WEATHER) in system["content"] and "Call a function now." in system["content"]
    assert call == {
        "role": "assistant",
        "content": '[{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "Paris"}}]',
    }
    assert results == {"role": "user", "content": "get_weather returned: sunny\nget_weather "
                       "returned: 21 C\nAnswer in plain words: Weather in Paris?"}  # fmt: skip
    rendered = _render(SMOLLM2_LIKE)(given_.messages)
    check_reaches(rendered, given_)
    with pytest.raises(Exception, match="neither tools nor a system message") as info:
        check_reaches(_render(NO_SYSTEM)(given_.messages), given_)
    assert info.value.param == "tools"
    # tool_choice none: no tool text; the history is still in words
    off = template_input(messages, parse_chat(_body(tool_choice="none")).tools, generic)
    assert off.instructions is None and off.messages[0]["content"] == "Be brief."
    # a native template gets the messages and the tools as they are
    native = template_input(messages, request, ToolTemplate(native=True, format="tagged"))
    assert native.messages == messages and native.tools == [WEATHER, ADD]


def _matcher(grammar: str):
    llguidance = pytest.importorskip("llguidance")
    from genai_runtime.decoding.guidance import load_tokenizer

    path = require_shared("models", "smollm2-135m-instruct-int4", "tokenizer.json")
    return llguidance.LLMatcher(load_tokenizer(path, 49152, [2]), grammar)


def _accepts(grammar: str, text: str) -> tuple[bool, bool]:
    """(whether the grammar reads all of ``text``, whether it may end there)."""
    matcher = _matcher(grammar)
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(
        str(require_shared("models", "smollm2-135m-instruct-int4", "tokenizer.json"))
    )
    ok = all(matcher.consume_token(t) for t in tok.encode(text, add_special_tokens=False).ids)
    return ok and not matcher.get_error(), matcher.is_accepting()


def test_forcing_holds_the_model_to_calls_not_to_one_way_of_writing_them():
    """Under ``required`` a tagged-format model may write its call tagged, bare or in a
    Markdown fence (as Qwen2.5-Coder does unforced), may end after any complete call, and
    without parallel calls writes exactly one."""
    tool = _tool()
    call = '{"name": "get_weather", "arguments": {"city": "Rome"}}'
    tagged = CALL_FORMATS["tagged"]
    for parallel in (True, False):
        grammar = tagged.grammar([tool], parallel)
        for text in (f"<tool_call>\n{call}\n</tool_call>", call, f"```json\n{call}\n```",
                     f"```\n{call}\n```"):  # fmt: skip
            assert _accepts(grammar, text) == (True, True), (parallel, text)
    two = f"<tool_call>\n{call}\n</tool_call>\n<tool_call>\n{call}\n</tool_call>"
    assert _accepts(tagged.grammar([tool], True), two) == (True, True)
    assert _accepts(tagged.grammar([tool], False), two)[0] is False
    assert _accepts(tagged.grammar([tool], True), "Sure! " + call)[0] is False  # calls only
    generic = CALL_FORMATS["generic"].grammar([tool], True)
    assert _accepts(generic, f"[{call}, {call}]") == (True, True)
    assert _accepts(generic, f"<tool_call>\n{call}\n</tool_call>")[0] is False  # not its form


def test_a_cut_call_never_lands_in_content():
    """A reply that ended inside a call (max_tokens) gives the calls it finished and no raw
    call text; JSON that is not a call stays content."""
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    for text, want in [
        (f'<tool_call>\n{call}\n</tool_call>\n<tool_call>\n{{"name":', [("get_weather",)]),
        ('<tool_call>\n{"name": "get_wea', []),
        ("<tool_call>", []),
        ('```json\n{"name": "get_weather", "argu', []),
        ('{"name": "add", "arguments": {"a": 1', []),
        ('{"a": 1', ['{"a": 1']),  # not a call: the reply's own JSON, cut
        ("Hello <tool_call>", ["Hello "]),
    ]:
        pieces = split_reply(text, NAMES)
        shape = [p if isinstance(p, str) else (p.name,) for p in pieces]
        assert shape == want, (text, pieces)


PYDANTIC_LIKE = {  # a model with a nested model, as pydantic writes it
    "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"},
                        "country": {"type": "string"}}, "required": ["city"]}},
    "type": "object",
    "properties": {"where": {"$ref": "#/$defs/Place"}, "also": {"$ref": "#/properties/where"},
                   "days": {"type": "integer"}},
    "required": ["where", "days"],
}  # fmt: skip


@pytest.mark.parametrize("several", [False, True])
@pytest.mark.parametrize("count", [1, 2])
def test_a_tools_own_refs_resolve_inside_the_call_wrapper(several, count):
    body = _body(tools=[{"type": "function", "function": {"name": f"t{i}",
                 "parameters": PYDANTIC_LIKE}} for i in range(count)],
                 tool_choice="required")  # fmt: skip
    tools = parse_chat(body).tools.callable
    fmt = CALL_FORMATS["generic"]
    schema = fmt._schema(tools, several)
    good = {"name": "t0", "arguments": {"where": {"city": "Rome"}, "days": 2}}
    jsonschema.validate(good, schema)  # the refs resolve where the tool's parameters now sit
    for bad in ({**good, "arguments": {"where": {"town": "Rome"}, "days": 2}},  # closed, nested
                {**good, "arguments": {"where": {"city": 5}, "days": 2}}):  # fmt: skip
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    assert rerooted({"$ref": "#"}, "#/a") == {"$ref": "#/a"}
    assert rerooted({"enum": [{"$ref": "#/x"}]}, "#/a") == {"enum": [{"$ref": "#/x"}]}  # data
    assert _accepts(fmt.grammar(tools, several), json.dumps(good)) == (True, True)


def test_closed_shuts_objects_in_definitions_and_alternatives_not_intersections():
    shut = closed({**PYDANTIC_LIKE, "anyOf": [{"properties": {"x": {}}}],
                   "allOf": [{"properties": {"y": {}}}]})  # fmt: skip
    assert shut["additionalProperties"] is False
    assert shut["$defs"]["Place"]["additionalProperties"] is False
    assert shut["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in shut["allOf"][0]
    assert closed({"properties": {}, "additionalProperties": True})["additionalProperties"]
