"""Chat templates written for the tool-calling tests, in SmolLM2's ChatML tokens: one per way a
template can take tools. Each is ours (the tests' own wording), shaped like a family's:

- ``TAGGED``: tools listed in the system turn, calls in ``<tool_call>`` tags, results in
  ``<tool_response>`` tags inside a user turn (the Qwen2.5 / Hermes shape);
- ``BARE_JSON``: tools listed in the first user turn, a call is a bare JSON object with
  ``parameters`` (the Llama 3.1 JSON shape), results in an ``ipython`` turn;
- ``NO_SYSTEM``: no tools and no system messages: nothing can carry tool definitions.
"""

from __future__ import annotations

import shutil
from pathlib import Path

TAGGED = r"""
{%- set first = messages[0] %}
{%- if tools %}
{{- '<|im_start|>system\n'
    + (first.content if first.role == 'system' else 'You are a helpful assistant.')
    + '\n\nFunctions you may call are listed in <tools></tools>, one JSON signature per line:'
    + '\n<tools>\n' }}
{%- for tool in tools %}{{ tool | tojson }}{{ '\n' }}{% endfor %}
{{- '</tools>\nTo call a function, write <tool_call></tool_call> around a JSON object with its'
    + ' name and arguments:\n<tool_call>\n{"name": "function name", "arguments": {"argument":'
    + ' "value"}}\n</tool_call><|im_end|>\n' }}
{%- elif first.role == 'system' %}
{{- '<|im_start|>system\n' + first.content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'tool' %}
{%- if loop.first or loop.previtem.role != 'tool' %}{{ '<|im_start|>user' }}{% endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or loop.nextitem.role != 'tool' %}{{ '<|im_end|>\n' }}{% endif %}
{%- elif message.role != 'system' %}
{{- '<|im_start|>' + message.role + '\n' + (message.content or '') }}
{%- for call in message.tool_calls or [] %}
{{- ('\n' if message.content or not loop.first else '')
    + '<tool_call>\n{"name": "' + call.function.name + '", "arguments": '
    + (call.function.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
""".strip()

BARE_JSON = r"""
{%- for message in messages %}
{%- if message.role == 'user' and loop.first and tools %}
{{- '<|im_start|>user\nAnswer with a function call as JSON {"name": function name,'
    + ' "parameters": object of arguments} if one helps. Functions:\n' }}
{%- for tool in tools %}{{ tool | tojson }}{{ '\n' }}{% endfor %}
{{- '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>ipython\n' + message.content + '<|im_end|>\n' }}
{%- elif message.tool_calls %}
{%- for call in message.tool_calls %}
{{- '<|im_start|>assistant\n{"name": "' + call.function.name + '", "parameters": '
    + (call.function.arguments | tojson) + '}<|im_end|>\n' }}
{%- endfor %}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
""".strip()

NO_SYSTEM = (
    "{% for m in messages %}{% if m.role != 'system' %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# A Qwen3-style thinking template: thinking on opens a <think> block in the generation prompt;
# enable_thinking false closes an empty one, as Qwen3's does.
THINKING = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}"
)


def model_with_template(source: Path, folder: Path, template: str) -> Path:
    """A copy of the model folder ``source`` whose chat template is ``template`` (files are
    copied: onnx refuses external data files with several hard links)."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in source.iterdir():
        if f.name != "chat_template.jinja":
            shutil.copy(f, folder / f.name)
    (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    return folder
