"""A small Dockerfile reader and the properties every project image keeps.

The project's Dockerfiles must build both against the public Python image
and against localcluster's own base, run as a non-root numeric user, start
with an exec-form entrypoint, and keep the multi-GB dependency layer apart
from the code so a code change rebuilds seconds, not minutes. These are
checked on the text: no Docker, no network, no library.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
PROJECT_DOCKERFILES = {
    "operator": REPO_ROOT / "operator" / "Dockerfile",
    "inference": REPO_ROOT / "inference_image" / "Dockerfile",
}
DEFAULT_BASE = "python:3.11-slim-bookworm"
# Files a dependency layer may be built from: lock files, nothing that changes with code.
_DEPENDENCY_INPUT = re.compile(r"(^|/)requirements[^/]*\.(lock|txt)$")


class DockerfileError(ValueError):
    """The text is not a Dockerfile this reader understands."""


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY...
    arguments: str  # the rest, continuation lines joined with a space
    line: int  # 1-based line where the instruction starts

    def exec_form(self) -> list[str] | None:
        """The JSON-array ("exec") form's words, or None for the shell form."""
        if not self.arguments.startswith("["):
            return None
        try:
            words = json.loads(self.arguments)
        except json.JSONDecodeError:
            return None  # Docker runs a malformed array as a shell command
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            return None
        return words

    def words(self) -> list[str]:
        """Whitespace-separated words, options (--from=...) left out."""
        return [w for w in self.arguments.split() if not w.startswith("--")]


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions in order. Comments and blank lines are dropped, lines
    ending in a backslash continue (comment lines inside a continuation are
    skipped, as Docker does). Heredocs are refused rather than misread."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        instructions.append(_instruction(" ".join(p for p in pending if p), start))
        pending = []
    if pending:
        raise DockerfileError(f"line {start}: the file ends inside a line continuation")
    return instructions


def _instruction(joined: str, line: int) -> Instruction:
    keyword, _, arguments = joined.partition(" ")
    if not re.fullmatch(r"[A-Za-z]+", keyword):
        raise DockerfileError(f"line {line}: {keyword!r} is not an instruction")
    if "<<" in arguments and keyword.upper() in {"RUN", "COPY"}:
        raise DockerfileError(f"line {line}: heredocs are not supported by this reader")
    return Instruction(keyword.upper(), arguments.strip(), line)


def violations(instructions: list[Instruction]) -> list[str]:
    """Every way the Dockerfile breaks the project's image rules (empty: none)."""
    found: list[str] = []
    first_from = next((i for i, ins in enumerate(instructions) if ins.keyword == "FROM"), None)
    if first_from is None:
        return ["no FROM"]
    base_args = [
        ins.arguments
        for ins in instructions[:first_from]
        if ins.keyword == "ARG" and ins.arguments.split("=", 1)[0] == "BASE"
    ]
    if base_args != [f"BASE={DEFAULT_BASE}"]:
        found.append(f"no `ARG BASE={DEFAULT_BASE}` before the first FROM")
    from_image = instructions[first_from].words()[0] if instructions[first_from].words() else ""
    if from_image not in {"${BASE}", "$BASE"}:
        found.append(f"the first FROM uses {from_image!r}, not ${{BASE}}")

    final_stage = _final_stage(instructions)
    users = [ins.arguments for ins in final_stage if ins.keyword == "USER"]
    if not users:
        found.append("the final stage sets no USER (it would run as root)")
    elif not _numeric_non_root(users[-1]):
        found.append(f"USER {users[-1]!r} is not a numeric non-root uid")

    entrypoints = [ins for ins in final_stage if ins.keyword == "ENTRYPOINT"]
    if not entrypoints:
        found.append("no ENTRYPOINT")
    elif entrypoints[-1].exec_form() is None:
        found.append("ENTRYPOINT is in shell form, not exec form")

    if any(ins.keyword == "HEALTHCHECK" for ins in instructions):
        found.append("HEALTHCHECK present (Kubernetes ignores it; probes belong in the pod)")

    found.extend(_layer_order_violations(final_stage))
    return found


def _final_stage(instructions: list[Instruction]) -> list[Instruction]:
    last_from = max(i for i, ins in enumerate(instructions) if ins.keyword == "FROM")
    return instructions[last_from:]


def _numeric_non_root(user: str) -> bool:
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or int(uid) == 0:
        return False
    return gid == "" or gid.isdigit()


def _copy_sources(ins: Instruction) -> list[str]:
    exec_words = ins.exec_form()
    words = exec_words if exec_words is not None else ins.words()
    return words[:-1]


def _layer_order_violations(stage: list[Instruction]) -> list[str]:
    """The dependency install must come before any code is copied in, and
    may only see lock files, or every code change would re-run it."""
    install = next(
        (
            i
            for i, ins in enumerate(stage)
            if ins.keyword == "RUN"
            and re.search(r"pip[^&|;]* install[^&|;]*\s(-r|--requirement)[\s=]", ins.arguments)
        ),
        None,
    )
    if install is None:
        return ["no RUN installs the locked requirements (pip install -r/--requirement)"]
    found: list[str] = []
    if "--require-hashes" not in stage[install].arguments:
        found.append(
            f"line {stage[install].line}: the locked requirements are installed without "
            "--require-hashes, so an archive other than the one locked would be accepted"
        )
    for ins in stage[:install]:
        if ins.keyword in {"COPY", "ADD"}:
            code = [s for s in _copy_sources(ins) if not _DEPENDENCY_INPUT.search(s)]
            if code:
                found.append(
                    f"line {ins.line}: {ins.keyword} {' '.join(code)} comes before the "
                    "dependency install, so a code change re-installs every dependency"
                )
    if not any(ins.keyword in {"COPY", "ADD"} for ins in stage[install + 1 :]):
        found.append("no COPY of the code after the dependency install")
    return found


@pytest.fixture
def parse() -> Callable[[str], list[Instruction]]:
    return parse_dockerfile


@pytest.fixture
def check() -> Callable[[str], list[str]]:
    """Text in, rule violations out."""
    return lambda text: violations(parse_dockerfile(text))


@pytest.fixture
def dockerfile_error() -> type[DockerfileError]:
    return DockerfileError
