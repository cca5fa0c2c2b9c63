"""Audit N4: the token limits are checked against the model's context window.

The tiny model's config and weights with `max_position_embeddings` cut to 64
(a llama computes past it all the same, so only the server can refuse): limits
chosen beyond the window stop the server (exit 2, naming them and the window),
default ones shrink into it, and a request beyond it gets OpenAI's 400.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from fusebox_server_harness import MODEL_NAME, ServerProcess, free_port
from test_seams import check_config, run_server

WINDOW = 64


@pytest.fixture(scope="module")
def small_window_dir(tiny_model_dir: Path, server_workdir: Path) -> Path:
    directory = server_workdir / f"window-{WINDOW}-{uuid.uuid4().hex[:6]}"
    directory.mkdir()
    for path in tiny_model_dir.iterdir():
        if path.name != "config.json":
            (directory / path.name).symlink_to(path)
    model_config = json.loads((tiny_model_dir / "config.json").read_text())
    model_config["max_position_embeddings"] = WINDOW
    (directory / "config.json").write_text(json.dumps(model_config))
    return directory


@pytest.fixture(scope="module")
def small_window(start_server: Any, small_window_dir: Path) -> ServerProcess:
    server: ServerProcess = start_server(flags={"model-dir": str(small_window_dir)})
    return server


def complete(server: ServerProcess, prompt: str, **fields: Any) -> Any:
    body = {"model": MODEL_NAME, "prompt": prompt, "temperature": 0, **fields}
    return server.client.post("/v1/completions", json=body)


def test_limits_chosen_beyond_the_window_stop_the_server_naming_them(
    small_window_dir: Path,
) -> None:
    flags = ["--model-dir", str(small_window_dir), "--max-input-tokens", "256"]
    flags += ["--max-new-tokens", "512"]
    ports = ["--port", str(free_port()), "--admin-port", str(free_port())]
    for result in (run_server(*flags, *ports), check_config(*flags)):
        assert result.returncode == 2, result.stderr
        last_line = result.stderr.strip().splitlines()[-1]  # the pod's termination message
        assert last_line.startswith("fusebox_server: --max-input-tokens 256 + --max-new-tokens 512")
        assert f"context window of {WINDOW} tokens" in last_line
        assert f"max_position_embeddings in {small_window_dir}/config.json" in last_line


def test_check_config_shows_the_default_limits_fitted_to_the_window(
    small_window_dir: Path,
) -> None:
    result = check_config("--model-dir", str(small_window_dir))
    assert result.returncode == 0, result.stderr
    assert f"context window {WINDOW} tokens, max input 63 + max new 63 tokens" in result.stdout


def test_a_prompt_longer_than_the_window_is_refused(small_window: ServerProcess) -> None:
    response = complete(small_window, "the cat sat on the mat and " * 60, max_tokens=10)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"


def test_a_prompt_and_max_tokens_beyond_the_window_are_refused_as_openai_does(
    small_window: ServerProcess,
) -> None:
    probe = complete(small_window, "Hello there, how are you", max_tokens=1)
    assert probe.status_code == 200, probe.text
    prompt_tokens = probe.json()["usage"]["prompt_tokens"]
    room = WINDOW - prompt_tokens

    over = complete(small_window, "Hello there, how are you", max_tokens=room + 1)
    assert over.status_code == 400, over.text
    error = over.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error"
    assert error["message"].startswith(
        f"This model's maximum context length is {WINDOW} tokens. However, you requested "
        f"{WINDOW + 1} tokens ({prompt_tokens} in the prompt, {room + 1} in the completion)."
    )
    assert complete(small_window, "Hello there, how are you", max_tokens=room).status_code == 200


def test_without_max_tokens_generation_stops_at_the_window(small_window: ServerProcess) -> None:
    response = complete(small_window, "Hello there, how are you")
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= WINDOW
