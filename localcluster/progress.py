"""How `up` and `down` report: progress lines, and the one error a caller must expect.

`up` takes tens of seconds; silence would look like a hang, so each step
says what it waits for. ClusterError carries a message meant for the user
(which make target to run, which log to read), never a traceback.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TextIO


class ClusterError(RuntimeError):
    """The cluster could not be brought to the requested state; the message says why."""


@dataclasses.dataclass
class Reporter:
    """Progress lines on a stream; `up` is slow enough that silence looks like a hang."""

    stream: TextIO
    started: float = dataclasses.field(default_factory=time.monotonic)

    def say(self, message: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"[{elapsed:5.1f}s] {message}", file=self.stream, flush=True)


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
