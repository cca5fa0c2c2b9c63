"""Which served admin Secret the operator takes its token from (admin_secret.py)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from fusebox_operator.admin_secret import MIN_TOKEN_CHARS, AdminSecretRefused, admin_token

UID = "0123abcd-0000-0000-0000-000000000000"
TOKEN = "k" * 43


def served(owners: list[dict[str, Any]] | None = None, data: dict[str, str] | None = None) -> Any:
    """A Secret as the apiserver sends it: camelCase metadata, base64 data."""
    if owners is None:
        owners = [{"kind": "InferenceService", "name": "chat", "uid": UID, "controller": True}]
    if data is None:
        data = {"token": base64.b64encode(TOKEN.encode()).decode()}
    return {
        "metadata": {"name": "chat-admin", "namespace": "team", "ownerReferences": owners},
        "data": data,
    }


def test_the_secret_the_service_controls_gives_its_token() -> None:
    assert admin_token(served(), UID) == TOKEN
    rotated = "r" * MIN_TOKEN_CHARS  # rotated by hand: taken, at the shortest length taken
    data = {"token": base64.b64encode(rotated.encode()).decode()}
    assert admin_token(served(data=data), UID) == rotated


@pytest.mark.parametrize(
    ("owners", "says"),
    [
        ([], "has no controller"),
        # An owner that is not the controller (a tool that lists itself) does not count.
        ([{"kind": "InferenceService", "uid": UID, "controller": False}], "has no controller"),
        ([{"kind": "InferenceService", "uid": "b-uid", "controller": True}], "uid b-uid"),
    ],
)
def test_a_secret_the_service_does_not_control_is_refused(
    owners: list[dict[str, Any]], says: str
) -> None:
    with pytest.raises(AdminSecretRefused) as refused:
        admin_token(served(owners=owners), UID)
    message = str(refused.value)
    assert (
        message.startswith("Secret team/chat-admin was not written by Fusebox") and says in message
    )
    assert "delete or rename it" in message and TOKEN not in message


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({}, "has no key token"),
        ({"token": ""}, "has no key token"),
        ({"token": "not base64!"}, "key token is not text"),
        ({"token": base64.b64encode(b"\xff\xfe").decode()}, "key token is not text"),
        ({"token": base64.b64encode(b"short").decode()}, "a token of 5 characters, fewer than 32"),
    ],
)
def test_a_missing_unreadable_or_short_token_is_refused(data: dict[str, str], says: str) -> None:
    with pytest.raises(AdminSecretRefused, match=says):
        admin_token(served(data=data), UID)
