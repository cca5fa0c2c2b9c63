"""Whether a served `<name>-admin` Secret is the one Fusebox wrote for this service.

Why: the pods mount the Secret by name and its token is the admin API's only
credential. The operator once took any Secret of that name as it found it, so
whoever could create Secrets in the namespace before the service existed could
plant a token they know (or a user's own Secret of that name became the admin
credential, and an empty one closed the admin API). A Secret is taken only when
its controller is this InferenceService (the owner reference the operator writes
on create, by uid) and its token is long enough to be a random one; otherwise the
operator says why and waits for it to be deleted or renamed. The token itself is
never part of a message.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from fusebox_contract.wiring import ADMIN_TOKEN_KEY

MIN_TOKEN_CHARS = 32
"""The shortest token taken; the operator writes `secrets.token_urlsafe(32)`: 43."""
CONFLICT_RETRY_SECONDS = 10
"""How often a reconcile held back by a foreign admin Secret looks again."""


class AdminSecretRefused(RuntimeError):
    """The Secret of the admin token's name is not one the operator may use (the reason)."""


def controller_uid(secret: Mapping[str, Any]) -> str | None:
    """The uid of the object that controls this object (metadata as served), if any."""
    for owner in (secret.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("controller"):
            return str(owner.get("uid") or "") or None
    return None


def admin_token(served: Mapping[str, Any], owner_uid: str, key: str = ADMIN_TOKEN_KEY) -> str:
    """The token of a served admin Secret (JSON as the apiserver sends it).

    Raises AdminSecretRefused, naming the Secret and why, when its controller is
    not the service `owner_uid` or its token is missing or under MIN_TOKEN_CHARS.
    """
    meta = served.get("metadata") or {}
    where = f"Secret {meta.get('namespace')}/{meta.get('name')}"
    advice = "delete or rename it and the operator writes its own"
    controller = controller_uid(served)
    if controller != owner_uid:
        held_by = f"controlled by uid {controller}" if controller else "has no controller"
        raise AdminSecretRefused(
            f"{where} was not written by Fusebox for this InferenceService ({held_by}, "
            f"expected uid {owner_uid}): its token is not used; {advice}"
        )
    raw = (served.get("data") or {}).get(key)
    if not raw:
        raise AdminSecretRefused(f"{where} has no key {key}: {advice}")
    try:
        token = base64.b64decode(raw, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise AdminSecretRefused(f"{where}: key {key} is not text: {advice}") from None
    if len(token) < MIN_TOKEN_CHARS:
        raise AdminSecretRefused(
            f"{where} holds a token of {len(token)} characters, fewer than {MIN_TOKEN_CHARS}: "
            f"its token is not used; {advice}"
        )
    return token
