"""`python -m bench [--list] [NAME ...]`: run every benchmark (bench/suite.py), one process each.

A benchmark whose prerequisite is absent (a cluster, the peer server's CLI)
is skipped with the reason printed; a failing one does not stop the others,
and the exit status says whether any failed (skips are not failures).
`--list` prints each benchmark, its command and whether it would run,
without running anything.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping

from bench.suite import HERE, SUITE, Benchmark, environment, scripts_without_an_entry

REPO = HERE.parent


def plan(names: list[str], environ: Mapping[str, str]) -> list[tuple[Benchmark, str | None]]:
    """The benchmarks to run, in order, each with the reason it cannot (or None)."""
    chosen = [benchmark for benchmark in SUITE if not names or benchmark.name in names]
    return [(benchmark, benchmark.missing(environ)) for benchmark in chosen]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="NAME", help="run only these (default: all)")
    parser.add_argument("--list", action="store_true", help="show the plan; run nothing")
    arguments = parser.parse_args(argv)
    known = [benchmark.name for benchmark in SUITE]
    unknown = [name for name in arguments.names if name not in known]
    if unknown:
        print(f"bench: unknown {unknown}; available: {known}", file=sys.stderr)
        return 2
    orphans = scripts_without_an_entry()
    if orphans:
        print(f"bench: {orphans} have no entry in bench/suite.py", file=sys.stderr)
        return 2
    environ = environment()
    steps = plan(arguments.names, environ)
    if arguments.list:
        for benchmark, missing in steps:
            verdict = f"skip: {missing}" if missing else shlex.join(benchmark.command(environ))
            print(f"{benchmark.name}: {verdict}")
        return 0
    failed: list[str] = []
    for benchmark, missing in steps:
        if missing:
            print(f"bench: {benchmark.name} skipped: {missing}", flush=True)
            continue
        started = time.monotonic()
        print(f"bench: {benchmark.name} ...", flush=True)
        # From the repository root: the scripts' default --out paths are relative to it.
        code = subprocess.call(benchmark.command(environ), cwd=REPO)
        print(f"bench: {benchmark.name} exit {code} after {time.monotonic() - started:.0f} s")
        if code != 0:
            failed.append(benchmark.name)
    if failed:
        print(f"bench: failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
