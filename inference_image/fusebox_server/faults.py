"""Fault injection for tests and the demo, armed only at process start.

Why: the operator's ladder (gc → empty_cache → unload → swap → restart) and
the wedge detection need real failures to act on, but a production process
must not be able to grow a leak because someone found an endpoint. So a
fault exists only if `FUSEBOX_FAULTS` named it when the process started;
`PUT /admin/v1/faults` (admin token) may then change armed faults, and
answers 403 for anything else. Nothing on the public API touches faults.

`FUSEBOX_FAULTS=leak:64,slow:100,wedge` arms:
- `leak:N`  hold N MiB per request on the model's device (0 = armed, off);
- `slow:N`  sleep N ms per generated token (0 = armed, off);
- `wedge`   armed, off; `wedge:1` wedges the event loop once the server is
  ready. Switched on (`{"wedge": 1}`), it blocks the event loop for good:
  nothing on that loop can switch it off again, exactly like a real wedge.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from fusebox_server.errors import Forbidden, InvalidRequest

FAULT_NAMES = ("leak", "slow", "wedge")


def parse_faults(spec: str) -> dict[str, int]:
    """`leak:64,slow:100,wedge` -> {"leak": 64, "slow": 100, "wedge": 0}."""
    faults: dict[str, int] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, raw = item.partition(":")
        name = name.strip()
        if name not in FAULT_NAMES:
            raise ValueError(f"unknown fault {name!r} in FUSEBOX_FAULTS (known: {FAULT_NAMES})")
        try:
            value = int(raw) if raw.strip() else 0
        except ValueError as error:
            raise ValueError(f"fault {name!r} needs an integer value, got {raw!r}") from error
        if value < 0:
            raise ValueError(f"fault {name!r} must not be negative")
        faults[name] = value
    return faults


class Faults:
    """The armed faults and their current values; read from any thread."""

    def __init__(self, armed: Mapping[str, int]) -> None:
        self._values = dict(armed)
        self._lock = threading.Lock()

    @property
    def armed(self) -> bool:
        return bool(self._values)

    def value(self, name: str) -> int:
        return self._values.get(name, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)

    def update(self, changes: object) -> dict[str, int]:
        """Apply an admin change; 403 unless every named fault was armed at start."""
        if not self._values:
            raise Forbidden("faults were not armed at start (FUSEBOX_FAULTS)")
        if not isinstance(changes, dict) or not changes:
            raise InvalidRequest('expected a JSON object such as {"leak": 64}')
        for name, value in changes.items():
            if name not in self._values:
                raise Forbidden(f"fault {name!r} was not armed at start")
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidRequest(f"fault {name!r} needs a non-negative integer", param=name)
        with self._lock:
            self._values.update(changes)
            return dict(self._values)
