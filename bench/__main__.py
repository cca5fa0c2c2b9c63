"""`python -m bench [NAME ...]`: run every bench/*_bench.py (or the named ones), one process each.

Each benchmark is a standalone script with its own flags and defaults, so a
new one is picked up by adding the file; a failing one does not stop the
others, and the exit status says whether any failed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def discover() -> dict[str, Path]:
    return {path.stem.removesuffix("_bench"): path for path in sorted(HERE.glob("*_bench.py"))}


def main(argv: list[str]) -> int:
    found = discover()
    names = argv or list(found)
    unknown = [name for name in names if name not in found]
    if unknown:
        print(f"bench: unknown {unknown}; available: {sorted(found)}", file=sys.stderr)
        return 2
    failed: list[str] = []
    for name in names:
        started = time.monotonic()
        print(f"bench: {name} ...", flush=True)
        code = subprocess.call([sys.executable, str(found[name])], cwd=HERE.parent)
        print(f"bench: {name} exit {code} after {time.monotonic() - started:.0f} s", flush=True)
        if code != 0:
            failed.append(name)
    if failed:
        print(f"bench: failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
