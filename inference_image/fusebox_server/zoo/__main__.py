"""`python -m fusebox_server.zoo build [FAMILY...]`: build zoo releases into the cache.

Prints each family's directory; with no family named, builds them all.
`python -m fusebox_server.zoo list` prints the families and what each exercises.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fusebox_server.zoo.families import FAMILIES
from fusebox_server.zoo.release import ensure_zoo_model


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fusebox_server.zoo", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build releases into FUSEBOX_CACHE/models")
    build.add_argument("families", nargs="*", metavar="FAMILY", help=", ".join(FAMILIES))
    commands.add_parser("list", help="the families and what each exercises")
    args = parser.parse_args(argv)
    if args.command == "list":
        for family in FAMILIES.values():
            print(f"{family.name}: {family.exercises}")
        return 0
    unknown = [name for name in args.families if name not in FAMILIES]
    if unknown:
        print(
            f"unknown famil{'y' if len(unknown) == 1 else 'ies'}: {', '.join(unknown)} "
            f"(families: {', '.join(FAMILIES)})",
            file=sys.stderr,
        )
        return 2
    for name in args.families or list(FAMILIES):
        print(f"{name}: {ensure_zoo_model(name)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
