"""`tool_choice: auto` across the process boundary: what a model writes in its family's
call format comes back from the real server as `tool_calls`.

A random model never writes a call, so these tests give the server a scripted one:
a zoo family's release (its tokenizer, chat template and eos ids) with weights set
so that greedy decoding follows a fixed text. Each piece of that text is one token
(the tokenizer gains added tokens for the pieces it lacks), every layer's
projections are zero, so the hidden state is the current token's embedding, and
the embeddings and the output projection chain the pieces: the prompt's last token
-> piece 1 -> piece 2 ... -> the end-of-turn token. Everything the client sees is
then the server's own work: template, generation, incremental detokenisation, the
family's call parser, the streamed deltas and `finish_reason`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from fusebox_server_harness import MODEL_NAME, ServerProcess, streamed_calls
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer

from fusebox_server.zoo.release import ensure_zoo_model

pytestmark = pytest.mark.integration

COPIED = ("chat_template.jinja", "generation_config.json", "special_tokens_map.json")
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {key: {"type": "string"}},
                "required": [key],
            },
        },
    }
    for name, key in (("get_weather", "city"), ("get_time", "zone"))
]
MESSAGES: Any = [{"role": "user", "content": "Weather in Paris, and the time there?"}]


@dataclass(frozen=True)
class Script:
    family: str
    pieces: tuple[str, ...]  # what the model writes, one token each, the end-of-turn last

    @property
    def text(self) -> str:
        return "".join(self.pieces[:-1])


HERMES = Script(
    "qwen2.5",
    (
        "Let me look that up.",
        "\n\n",  # whitespace around the call: content, streamed or not, has none of it
        "<tool_call>",
        '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n',
        "</tool_call>",
        " \n",
        "<|im_end|>",
    ),
)
LLAMA3_TWO_CALLS = Script(
    "llama3",
    (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "; ",
        '{"name": "get_time", "parameters": {"zone": "Europe/Paris"}}',
        "<|eot_id|>",
    ),
)


def _token_ids(release: Path, pieces: tuple[str, ...]) -> list[int]:
    """Each piece's id in the release's tokenizer, added as a token where missing."""
    path = release / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    missing = [piece for piece in pieces if tokenizer.token_to_id(piece) is None]
    tokenizer.add_tokens([AddedToken(piece, normalized=False, special=False) for piece in missing])
    tokenizer.save(str(path))
    # Read the ids back from the file: the server loads that, and a reload numbers
    # added tokens afresh (after the model's own vocabulary), not as add_tokens did.
    saved = Tokenizer.from_file(str(path))
    ids = [saved.token_to_id(piece) for piece in pieces]
    vocab_size = json.loads((release / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    assert all(i is not None and i < vocab_size for i in ids), ids
    return ids


def _prompt_last_token(release: Path) -> int:
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(str(release), local_files_only=True)
    ids = tokenizer.apply_chat_template(
        MESSAGES, tools=TOOLS, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    return int(ids[-1])


def scripted_release(script: Script, target: Path) -> Path:
    """The family's release in `target`, one layer deep, writing `script` greedily."""
    from transformers import AutoConfig, AutoModelForCausalLM

    source = ensure_zoo_model(script.family)
    target.mkdir(parents=True)
    for name in (*COPIED, "tokenizer.json", "tokenizer_config.json", "config.json"):
        if (source / name).exists():
            shutil.copy(source / name, target / name)
    pieces = _token_ids(target, script.pieces)
    chain = [_prompt_last_token(target), *pieces]
    assert len(set(chain)) == len(chain), f"a token repeats, so the chain forks: {chain}"

    config = AutoConfig.from_pretrained(str(target), local_files_only=True)
    config.num_hidden_layers = 1
    config.layer_types = config.layer_types[:1] if getattr(config, "layer_types", None) else None
    config.tie_word_embeddings = False
    assert config.hidden_size >= len(chain)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.fill_(1.0 if name.endswith("norm.weight") else 0.0)
        embeddings = model.get_input_embeddings().weight
        output = model.get_output_embeddings().weight
        for step, (token, following) in enumerate(zip(chain, chain[1:], strict=False)):
            embeddings[token, step] = 1.0  # the hidden state names the step...
            output[following, step] = 1.0  # ...and the step names the next token
    config.save_pretrained(str(target))
    tensors = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


@pytest.fixture(scope="module")
def server_of(server_workdir: Path) -> Iterator[Any]:
    started: dict[str, ServerProcess] = {}

    def start(script: Script) -> ServerProcess:
        if script.family not in started:
            workdir = server_workdir / f"auto-{script.family}"
            release = scripted_release(script, workdir / "model")
            server = ServerProcess(workdir, release, {"max-new-tokens": 32}, {})
            server.wait_ready()
            started[script.family] = server
        return started[script.family]

    yield start
    for server in started.values():
        server.stop()


def _chat(server: ServerProcess, **fields: Any) -> Any:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
        arguments: dict[str, Any] = {
            "model": MODEL_NAME,
            "messages": MESSAGES,
            "tools": TOOLS,
            "temperature": 0,
            "max_tokens": 16,
        }
        arguments.update(fields)
        if arguments.get("stream"):
            return list(client.chat.completions.create(**arguments))
        return client.chat.completions.create(**arguments)


def _calls(message: Any) -> list[tuple[str, Any]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def test_the_script_is_what_the_model_says_without_tools(server_of: Any) -> None:
    """The premise: the scripted release, asked without tools, writes its script as text."""
    for script in (HERMES, LLAMA3_TWO_CALLS):
        answer = _chat(server_of(script), tool_choice="none")
        assert answer.choices[0].message.content == script.text
        assert answer.choices[0].finish_reason == "stop"
        assert not answer.choices[0].message.tool_calls


def test_a_hermes_call_with_text_before_it_comes_back_as_content_and_a_call(
    server_of: Any,
) -> None:
    answer = _chat(server_of(HERMES))
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look that up."
    assert _calls(choice.message) == [("get_weather", {"city": "Paris"})]
    assert choice.message.tool_calls[0].id.startswith("call_")
    # Each piece a token; the end-of-turn token ends the answer and is not counted.
    assert answer.usage.completion_tokens == len(HERMES.pieces) - 1


def test_llama3_calls_come_back_as_parallel_calls_or_only_the_first(server_of: Any) -> None:
    server = server_of(LLAMA3_TWO_CALLS)
    both = _chat(server).choices[0]
    assert both.finish_reason == "tool_calls" and both.message.content is None
    assert _calls(both.message) == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"zone": "Europe/Paris"}),
    ]
    ids = [c.id for c in both.message.tool_calls]
    assert len(set(ids)) == 2
    first = _chat(server, parallel_tool_calls=False).choices[0]
    assert _calls(first.message) == [("get_weather", {"city": "Paris"})]


def test_a_call_of_an_undeclared_function_stays_text(server_of: Any) -> None:
    """Only get_time is declared: the weather call is the model's text, returned whole."""
    answer = _chat(server_of(HERMES), tools=TOOLS[1:])
    choice = answer.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content == HERMES.text


@pytest.mark.parametrize("script", [HERMES, LLAMA3_TWO_CALLS], ids=lambda s: s.family)
def test_streamed_auto_calls_arrive_as_deltas_and_never_as_text(
    server_of: Any, script: Script
) -> None:
    whole = _chat(server_of(script)).choices[0]
    calls, finishes, content = streamed_calls(_chat(server_of(script), stream=True))
    assert [f for f in finishes if f] == ["tool_calls"]
    assert content == (whole.message.content or "")
    assert "<tool_call>" not in content and '"name"' not in content
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == _calls(
        whole.message
    )
    assert all(c["id"].startswith("call_") for c in calls.values())
