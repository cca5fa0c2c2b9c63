"""What crosses the server's edges: --check-config, an unservable fallback, live ConfigMap
files, the recorded revision and dtype, torch threads, and the variant header."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fusebox_server_harness import ServerProcess, free_port

from fusebox_contract.admin import (
    ActionRequest,
    DegradationRequest,
    ErrorAnswer,
)
from fusebox_contract.names import (
    ActionType,
    DegradationLevel,
    Variant,
)
from fusebox_contract.stats import parse

REVISION = "3f2a9c1"


def check_config(
    *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return run_server("--check-config", *flags, env=env)


def run_server(*flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FUSEBOX_")}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "fusebox_server", *flags],
        capture_output=True,
        text=True,
        env=environment,
        timeout=180,
        check=False,
    )


def test_check_config_accepts_a_valid_configuration_from_flags_and_env(
    tiny_model_dir: Path,
) -> None:
    result = check_config(
        "--device",
        "cpu",
        env={"FUSEBOX_MODEL_DIR": str(tiny_model_dir), "FUSEBOX_FALLBACK_QUANTIZATION": "int8"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("config ok: ")
    assert "int8" in result.stdout and "device cpu" in result.stdout


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        pytest.param(["--fallback-quantization", "fp8"], "needs a CUDA device", id="fp8-on-cpu"),
        pytest.param(["--fallback-quantization", "int4"], "needs a CUDA device", id="int4-on-cpu"),
        pytest.param(["--fallback-quantization", "awq"], "fallback-quantization", id="awq"),
        pytest.param(["--dtype", "float8"], "--dtype", id="bad-dtype"),
        pytest.param(["--fallback-dir", "/nonexistent"], "not a directory", id="no-fallback-dir"),
    ],
)
def test_check_config_refuses_with_the_reason_and_exit_2(
    tiny_model_dir: Path, flags: list[str], reason: str
) -> None:
    result = check_config("--model-dir", str(tiny_model_dir), "--device", "cpu", *flags)
    assert result.returncode == 2
    assert reason in result.stderr
    assert result.stdout == ""


def test_check_config_wants_a_model_directory_with_a_config(tmp_path: Path) -> None:
    result = check_config("--model-dir", str(tmp_path), "--device", "cpu")
    assert result.returncode == 2 and "config.json" in result.stderr


@pytest.mark.parametrize("flag", ["--model-dir", "--fallback-dir"])
def test_a_model_directory_missing_from_the_volume_stops_the_server_with_its_name(
    tiny_model_dir: Path, tmp_path: Path, flag: str
) -> None:
    missing = tmp_path / "models" / "no-such-model"
    dirs = {"--model-dir": str(tiny_model_dir), "--fallback-dir": str(tiny_model_dir)}
    dirs[flag] = str(missing)
    port_flags = ["--port", str(free_port()), "--admin-port", str(free_port())]
    result = run_server(*(f for pair in dirs.items() for f in pair), *port_flags)
    assert result.returncode == 2, result.stderr
    assert f"{flag} {missing}: not a directory" in result.stderr
    assert "Traceback" not in result.stderr and "Repo id" not in result.stderr


@pytest.mark.parametrize("flag", ["--model-dir", "--fallback-dir"])
def test_a_missing_model_directory_stops_the_server_before_torch_is_imported(
    tiny_model_dir: Path, tmp_path: Path, flag: str
) -> None:
    """A pod crash-looping on a wrong path exits at once, not after torch's import
    (seconds; tens of seconds under a small CPU limit): Python's import trace shows
    the process never imported torch or transformers."""
    dirs = {"--model-dir": str(tiny_model_dir), "--fallback-dir": str(tiny_model_dir)}
    dirs[flag] = str(tmp_path / "no-such-model")
    result = run_server(
        *(f for pair in dirs.items() for f in pair), env={"PYTHONPROFILEIMPORTTIME": "1"}
    )
    assert result.returncode == 2, result.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()}
    assert "fusebox_server.control.early_checks" in imported, result.stderr[-2000:]
    assert not {"torch", "transformers"} & imported, "torch or transformers was imported"
    assert result.stderr.rstrip().splitlines()[-1].startswith(f"fusebox_server: {flag} ")


@pytest.fixture(scope="module")
def canned_file(server_workdir: Path) -> Path:
    path = server_workdir / f"canned-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps({"ping": "answer A"}))
    return path


@pytest.fixture(scope="module")
def seamed(start_server: Any, canned_file: Path) -> Iterator[ServerProcess]:
    """int4 on a CPU device: the fallback cannot be served, the primary must be."""
    server = start_server(
        flags={
            "device": "cpu",
            "fallback-quantization": "int4",
            "canned-answers-file": str(canned_file),
            "model-revision": REVISION,
            "dtype": "bfloat16",
        }
    )
    yield server
    server.stop()


def test_an_unservable_fallback_leaves_the_primary_serving(seamed: ServerProcess) -> None:
    state = seamed.state()
    assert state.fallback_configured is True
    assert "int4" in (state.fallback_unavailable_reason or "")
    assert "CUDA" in (state.fallback_unavailable_reason or "")
    response = seamed.chat("hi")
    assert response.status_code == 200 and response.headers["x-fusebox-variant"] == "primary"
    swap = seamed.send(ActionRequest(uuid.uuid4().hex, ActionType.SWAP, Variant.FALLBACK))
    assert swap.status_code == 409
    refusal = ErrorAnswer.parse(swap.json())
    assert refusal.code == "fallback_unavailable" and "CUDA" in refusal.message
    # Level 2 sets the level, swaps nothing, and the primary keeps serving.
    level = seamed.send(DegradationRequest(DegradationLevel.FALLBACK_MODEL))
    assert level.status_code == 200
    assert level.json() == {
        "level": 2,
        "tiers": ["no-streaming", "fallback-model"],
        "variant": "primary",
        "targetVariant": "primary",
        "converging": False,
    }
    assert seamed.chat("hi").headers["x-fusebox-variant"] == "primary"
    seamed.send(DegradationRequest(DegradationLevel.NONE)).raise_for_status()


def test_the_stats_file_says_the_fallback_cannot_be_swapped_to_and_why(
    seamed: ServerProcess,
) -> None:
    reading = parse(seamed.stats_file.read_text())
    assert reading.valid and reading.document is not None
    state = reading.document.state
    assert state.fallback_configured is True
    assert state.fallback_available is False
    assert state.fallback_unavailable_reason is not None
    assert "int4" in state.fallback_unavailable_reason
    assert "CUDA" in state.fallback_unavailable_reason


def test_revision_dtype_and_torch_threads_are_recorded(seamed: ServerProcess) -> None:
    state = seamed.state()
    assert state.model_revision == REVISION
    assert state.dtype == "bfloat16"
    assert state.torch_threads == 1
    models = seamed.client.get("/v1/models").json()["data"]
    assert models[0]["revision"] == REVISION
    starting = next(
        json.loads(line) for line in seamed.log_text().splitlines() if '"server_starting"' in line
    )
    assert starting["model_revision"] == REVISION


def test_canned_answers_are_reread_when_the_file_is_replaced(
    seamed: ServerProcess, canned_file: Path
) -> None:
    seamed.send(DegradationRequest(DegradationLevel.CANNED_ANSWERS)).raise_for_status()
    try:
        first = seamed.chat("ping")
        assert first.json()["choices"][0]["message"]["content"] == "answer A"
        assert first.headers["x-fusebox-served-by"] == "canned"
        assert first.headers["x-fusebox-variant"] == "primary"

        # As the kubelet does: write a new file beside it, then rename over.
        replace(canned_file, json.dumps({"ping": "answer B"}))
        seamed.wait_for(
            lambda: (
                seamed.chat("ping", max_tokens=16).json()["choices"][0]["message"]["content"]
                == "answer B"
            ),
            timeout=15,
            what="the new canned answer",
        )

        # A broken file keeps the previous answers, and the server lives on.
        replace(canned_file, "{not json")
        seamed.wait_for(
            lambda: "config_file_rejected" in seamed.log_text(), what="the rejection warning"
        )
        assert (
            seamed.chat("ping", max_tokens=16).json()["choices"][0]["message"]["content"]
            == "answer B"
        )
        assert seamed.client.get("/healthz").status_code == 200
    finally:
        replace(canned_file, json.dumps({"ping": "answer A"}))
        seamed.send(DegradationRequest(DegradationLevel.NONE)).raise_for_status()


def test_canned_answers_meet_stop_and_leave_what_they_cannot_honour_to_the_model(
    seamed: ServerProcess,
) -> None:
    seamed.send(DegradationRequest(DegradationLevel.CANNED_ANSWERS)).raise_for_status()
    try:
        stopped = seamed.chat("ping", stop=["x", " "])  # "answer A": cut before the space
        assert stopped.headers["x-fusebox-served-by"] == "canned"
        assert stopped.json()["choices"][0]["message"]["content"] == "answer"
        assert stopped.json()["choices"][0]["finish_reason"] == "stop"
        for fields in (
            {"n": 2},
            {"response_format": {"type": "json_object"}},
            {"logit_bias": {"5": 1}},
        ):
            answer = seamed.chat("ping", **fields)
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-fusebox-served-by"] != "canned", fields
        outside = seamed.chat("ping", logit_bias={"100000000": 1})
        assert outside.status_code == 400 and outside.json()["error"]["param"] == "logit_bias"
    finally:
        seamed.send(DegradationRequest(DegradationLevel.NONE)).raise_for_status()


def test_a_canned_answer_is_cut_to_max_tokens_as_a_generation_is(seamed: ServerProcess) -> None:
    seamed.send(DegradationRequest(DegradationLevel.CANNED_ANSWERS)).raise_for_status()
    try:
        seamed.wait_for(  # a test before may have left the file being re-read
            lambda: (
                seamed.chat("ping", max_tokens=16).json()["choices"][0]["message"]["content"]
                == "answer A"
            ),
            timeout=15,
            what="the canned answer",
        )
        # "answer A" is 4 tokens of the tiny model's tokenizer.
        whole = seamed.chat("ping", max_tokens=4).json()
        assert whole["choices"][0]["message"]["content"] == "answer A"
        assert whole["choices"][0]["finish_reason"] == "stop"
        assert whole["usage"]["completion_tokens"] == 4
        cut = seamed.chat("ping", max_tokens=2)
        assert cut.headers["x-fusebox-served-by"] == "canned"
        body = cut.json()
        text = body["choices"][0]["message"]["content"]
        assert "answer A".startswith(text) and text != "answer A"
        assert body["choices"][0]["finish_reason"] == "length"
        assert 0 < body["usage"]["completion_tokens"] <= 2
        streamed = seamed.client.post(
            "/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "ping"}],
                "max_tokens": 2,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        events = [
            json.loads(line[len("data: ") :])
            for line in streamed.text.splitlines()
            if line.startswith("data: {")
        ]
        deltas = [e["choices"][0] for e in events if e["choices"]]
        assert "".join(d["delta"].get("content") or "" for d in deltas) == text
        assert deltas[-1]["finish_reason"] == "length"
        assert events[-1]["usage"]["completion_tokens"] == body["usage"]["completion_tokens"]
    finally:
        seamed.send(DegradationRequest(DegradationLevel.NONE)).raise_for_status()


def replace(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:6]}")
    temporary.write_text(text)
    temporary.rename(path)


def test_every_response_names_the_variant(server: ServerProcess) -> None:
    for response in (
        server.chat("hi"),
        server.chat("hi", model="no-such-model"),
        server.client.get("/v1/models"),
        server.client.get("/readyz"),
        server.client.get("/no/such/route"),
    ):
        assert response.headers["x-fusebox-variant"] == "primary", response.url
