"""A chat template that raises on the messages it is given (a role it does not take, a
failure inside it) is the caller's 400, in OpenAI's shape, naming `messages` and saying
what the template said: never a 500, a traceback, or a path of the server's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from fusebox_server.config import ServerConfig
from fusebox_server.control.runtime import Runtime
from fusebox_server.http.app import CHAT_PATH, build_api_app

from .runtime_runs import run_with_runtime

RAISES_ON_SYSTEM = (
    "{% for m in messages %}{% if m.role == 'system' %}"
    "{{ raise_exception('This model does not support the system role') }}"
    "{% endif %}{{ m.content }}{% endfor %}"
)
RAISES_A_PATH = (
    "{% for m in messages %}{{ raise_exception('cannot read /opt/venv/lib/templates/x.jinja"
    "\\n  line 3') }}{% endfor %}"
)
RAISES_NOTHING_SAID = "{% for m in messages %}{{ raise_exception('') }}{% endfor %}"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def _answers(tiny_model_dir: Path, template: str) -> list[httpx.Response]:
    config = ServerConfig(model_dir=tiny_model_dir, torch_threads=1)

    async def scenario(runtime: Runtime) -> list[httpx.Response]:
        runtime.encoder().tokenizer.chat_template = template
        transport = httpx.ASGITransport(app=build_api_app(runtime))
        async with httpx.AsyncClient(transport=transport, base_url="http://fusebox") as client:
            body: dict[str, Any] = {"model": config.model_name, "messages": MESSAGES}
            return [
                await client.post(CHAT_PATH, json={**body, "stream": stream})
                for stream in (False, True)
            ]

    return run_with_runtime(config, scenario)


@pytest.mark.parametrize(
    ("template", "said"),
    [
        pytest.param(RAISES_ON_SYSTEM, "This model does not support the system role", id="role"),
        pytest.param(RAISES_A_PATH, "cannot read <path> line 3", id="a-path"),
        pytest.param(RAISES_NOTHING_SAID, "TemplateError (no message)", id="no-message"),
    ],
)
def test_a_template_that_raises_is_a_400_naming_messages_and_what_it_said(
    tiny_model_dir: Path, template: str, said: str
) -> None:
    for response in _answers(tiny_model_dir, template):
        assert response.status_code == 400, response.text
        assert response.headers["content-type"].startswith("application/json")
        error = response.json()["error"]
        assert error == {
            "message": f"the model's chat template rejected the messages: {said}",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "invalid_request",
        }
        assert "Traceback" not in response.text and "/opt" not in response.text
