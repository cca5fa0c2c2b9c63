"""Chat templates (jinja) in each family's documented turn format, written here.

Why: the server renders every chat request through the model's own
template (`tokenization.PromptEncoder.render_chat`), so each family's turn
markup, system-prompt rule and tool format must be the family's. These
follow the formats the families document: Llama 3 header blocks ending in
<|eot_id|> (tools listed as JSON in the system turn, results in an `ipython`
turn); ChatML for Qwen (a default system prompt for 2.5, tools in
<tools></tools>, calls in <tool_call></tool_call>, results in
<tool_response></tool_response>); Mistral's [INST] turns (the system prompt
leads the first user turn); Gemma's <start_of_turn> turns with the `model`
role (no system role: it leads the first user turn); Phi-3's <|role|> turns.
"""

from __future__ import annotations

from typing import Final

LLAMA3: Final = (
    "{{ bos_token }}"
    "{% if tools %}"
    "{{ '<|start_header_id|>system<|end_header_id|>\\n\\nEnvironment: ipython\\n' }}"
    '{{ \'Call a function by answering {"name": its name, "parameters": its arguments}.\\n\' }}'
    "{% for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}"
    "{{ '<|eot_id|>' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% set role = 'ipython' if message['role'] == 'tool' else message['role'] %}"
    "{{ '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' }}"
    "{% if message.get('tool_calls') %}"
    "{% for call in message['tool_calls'] %}"
    "{{ '{\"name\": \"' + call['function']['name'] + '\", \"parameters\": ' }}"
    "{{ call['function']['arguments'] | tojson }}{{ '}' }}"
    "{% endfor %}"
    "{% else %}{{ message['content'] | trim }}{% endif %}"
    "{{ '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)

_CHATML_TOOLS = (
    "{% if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}"
    "{% elif default_system %}{{ default_system + '\\n\\n' }}{% endif %}"
    "{{ '# Tools\\n\\nYou may call one or more functions. Their signatures are in "
    "<tools></tools>:\\n<tools>' }}"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n</tools>\\n\\nReturn each call as a JSON object in <tool_call></tool_call>."
    "<|im_end|>\\n' }}"
    "{% elif messages[0]['role'] != 'system' and default_system %}"
    "{{ '<|im_start|>system\\n' + default_system + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% if not tools %}{{ '<|im_start|>system\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message['content'] + "
    "'\\n</tool_response><|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{{ '\\n<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", "
    "\"arguments\": ' }}{{ call['function']['arguments'] | tojson }}"
    "{{ '}\\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Qwen 2.5 adds its default system prompt when the conversation has none; Qwen 3 does not.
QWEN2_5: Final = (
    "{% set default_system = 'You are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.' %}" + _CHATML_TOOLS
)
QWEN3: Final = "{% set default_system = '' %}" + _CHATML_TOOLS

MISTRAL: Final = (
    "{{ bos_token }}"
    "{% set system = messages[0]['content'] if messages[0]['role'] == 'system' else '' %}"
    "{% set turns = messages[1:] if messages[0]['role'] == 'system' else messages %}"
    "{% for message in turns %}"
    "{% if message['role'] == 'user' %}"
    "{% if loop.first and system %}"
    "{{ '[INST] ' + system + '\\n\\n' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endif %}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ ' ' + message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Mistral turns are user and assistant only') }}"
    "{% endif %}"
    "{% endfor %}"
)

GEMMA2: Final = (
    "{{ bos_token }}"
    "{% set system = messages[0]['content'] if messages[0]['role'] == 'system' else '' %}"
    "{% set turns = messages[1:] if messages[0]['role'] == 'system' else messages %}"
    "{% for message in turns %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{% if role not in ('user', 'model') %}"
    "{{ raise_exception('Gemma turns are user and model only') }}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' }}"
    "{% if loop.first and system %}{{ system + '\\n\\n' }}{% endif %}"
    "{{ message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)

PHI3: Final = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
