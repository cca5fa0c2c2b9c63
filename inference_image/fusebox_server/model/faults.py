"""Fault injection for tests and the demo, armed only at process start.

Why: the operator's ladder (gc → empty_cache → unload → swap → restart) and
the wedge detection need real failures to act on, but a production process
must not be able to grow a leak because someone found an endpoint. So a
fault exists only if `FUSEBOX_FAULTS` named it when the process started;
a `FaultsRequest` on the admin port (admin token) may then change armed
faults, and is answered 403 for anything else. Nothing on the public API touches faults.

`FUSEBOX_FAULTS=leak:64,slow:100,wedge` arms:
- `leak:N`  hold N MiB per request on the model's device, referenced by the
  loaded model: only unload+reload (or a swap) frees it (0 = armed, off);
- `leak_cycles:N`, `leak_allocator:N`, `leak_prompt_cache:N`, `leak_pinned:N`
  the leak kinds a cheaper ladder step cures (gc; empty_cache for the other
  three), N MiB per request; `leaks.py` says what holds each one;
- `slow:N`  sleep N ms per generated token (0 = armed, off);
- `wedge`   armed, off; `wedge:1` wedges the event loop once the server is
  ready. Switched on (`{"wedge": 1}`), it blocks the event loop for good:
  nothing on that loop can switch it off again, exactly like a real wedge.
- `load_delay:N` every model load (a reload, a swap, a degradation level
  that changes the variant) takes N seconds longer, as a large model's load
  does (0 = armed, off): the pod is unready meanwhile, which is what the
  operator's one-pod-at-a-time rollout must be proven against.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from fusebox_contract.names import Fault
from fusebox_server.errors import Forbidden
from fusebox_server.model.engine import LoadedModel, leak_block
from fusebox_server.model.leaks import Leaks


def parse_faults(spec: str) -> dict[Fault, int]:
    """`leak:64,slow:100,wedge` -> {LEAK: 64, SLOW: 100, WEDGE: 0}."""
    faults: dict[Fault, int] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, raw = item.partition(":")
        name = name.strip()
        if name not in set(Fault):
            known = ", ".join(f.value for f in Fault)
            raise ValueError(f"unknown fault {name!r} in FUSEBOX_FAULTS (known: {known})")
        try:
            value = int(raw) if raw.strip() else 0
        except ValueError as error:
            raise ValueError(f"fault {name!r} needs an integer value, got {raw!r}") from error
        if value < 0:
            raise ValueError(f"fault {name!r} must not be negative")
        faults[Fault(name)] = value
    return faults


class Faults:
    """The armed faults and their current values; read from any thread."""

    def __init__(self, armed: Mapping[Fault, int]) -> None:
        self._values = {Fault(name): value for name, value in armed.items()}
        self._lock = threading.Lock()
        self.leaks = Leaks()

    @property
    def armed(self) -> bool:
        return bool(self._values)

    def value(self, fault: Fault) -> int:
        return self._values.get(fault, 0)

    def grow_leaks(self, loaded: LoadedModel) -> None:
        """Every armed leak grows by its value: called by the worker as a generation starts."""
        if not self._values:
            return
        with self._lock:
            values = dict(self._values)
        leak_block(loaded, values.get(Fault.LEAK, 0))
        self.leaks.grow(values, loaded.device)

    def snapshot(self) -> dict[Fault, int]:
        with self._lock:
            return dict(self._values)

    def update(self, changes: Mapping[Fault, int]) -> dict[Fault, int]:
        """Apply an admin change (`FaultsRequest`, read by the contract); 403 unless every
        named fault was armed at start. Every armed fault's value comes back."""
        if not self._values:
            raise Forbidden("faults were not armed at start (FUSEBOX_FAULTS)")
        for fault in changes:
            if fault not in self._values:
                raise Forbidden(f"fault {str(fault)!r} was not armed at start")
        with self._lock:
            self._values.update({Fault(fault): value for fault, value in changes.items()})
            values = dict(self._values)
        self.leaks.changed(values)
        return values
