"""A real server process serving zoo families, through the official openai client.

The CPU equality per family is proven in-process (tests/unit/zoo/); here the
server itself loads a release (sharded safetensors, an eos list, the family's
tokenizer and template) and answers chat and its stream with exactly the
text transformers generates for the same rendered conversation. Gemma 2 is
the family most unlike the tiny Llama: eager attention with soft-capping,
sliding and global layers, a 256k vocabulary with byte fallback, tied
embeddings, no system role (the template folds it into the first turn).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from fusebox_server_harness import MODEL_NAME, ServerProcess, zoo_server

from fusebox_server.zoo.release import ensure_zoo_model

FAMILY = "gemma2"
MESSAGES = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "你好, what is the weather? 🚀"},
]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def family_server(server_workdir: Path) -> Iterator[ServerProcess]:
    with zoo_server(FAMILY, server_workdir, max_new_tokens=64) as server:
        yield server


def _transformers_text() -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = str(ensure_zoo_model(FAMILY))
    tokenizer: Any = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    output = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
    )
    return str(tokenizer.decode(output[0, len(ids) :], skip_special_tokens=True))


def test_the_server_answers_and_streams_what_transformers_generates(
    family_server: ServerProcess,
) -> None:
    client = openai.OpenAI(base_url=f"{family_server.url}/v1", api_key="unused", max_retries=0)
    request: Any = {
        "model": MODEL_NAME,
        "messages": MESSAGES,
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
    }
    answer = client.chat.completions.create(**request)
    pieces = [
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(**request, stream=True)
        if chunk.choices
    ]
    expected = _transformers_text()
    assert answer.choices[0].message.content == expected
    assert "".join(pieces) == expected
    assert answer.usage is not None and answer.usage.completion_tokens == NEW_TOKENS


def test_a_developer_message_is_the_system_turn(family_server: ServerProcess) -> None:
    """OpenAI's `developer` role means system: Gemma's template, which folds a system turn
    into the first user turn and refuses roles it does not know, renders it as one."""
    client = openai.OpenAI(base_url=f"{family_server.url}/v1", api_key="unused", max_retries=0)
    answers = [
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{**MESSAGES[0], "role": role}, *MESSAGES[1:]],  # type: ignore[list-item]
            max_tokens=4,
            temperature=0,
        )
        for role in ("system", "developer")
    ]
    assert answers[1].choices[0].message.content == answers[0].choices[0].message.content
    assert answers[1].usage is not None and answers[0].usage is not None
    assert answers[1].usage.prompt_tokens == answers[0].usage.prompt_tokens
