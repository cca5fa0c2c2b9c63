"""The project's Dockerfiles keep the image rules, and the rule checker
catches each way of breaking them (so a passing check means something)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]

Check = Callable[[str], list[str]]

GOOD = """\
# syntax=docker/dockerfile:1
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
COPY requirements.lock /tmp/requirements.lock
RUN python3 -m venv /opt/venv \\
 && /opt/venv/bin/pip install \\
      --require-hashes --requirement /tmp/requirements.lock
COPY pyproject.toml /src/pyproject.toml
COPY app /src/app
RUN /opt/venv/bin/pip install --no-deps /src
USER 65532:65532
ENTRYPOINT ["/opt/venv/bin/python", "-m", "app"]
"""


@pytest.mark.parametrize(
    "dockerfile", ["operator/Dockerfile", "inference_image/Dockerfile"], ids=lambda p: p
)
def test_project_dockerfile_keeps_every_image_rule(dockerfile: str, check: Check) -> None:
    assert check((REPO_ROOT / dockerfile).read_text()) == []


def test_a_dockerfile_keeping_the_rules_has_no_violation(check: Check) -> None:
    assert check(GOOD) == []


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("ARG BASE=python:3.11-slim-bookworm\n", "", "no `ARG BASE=python:3.11-slim-bookworm`"),
        ("BASE=python:3.11-slim-bookworm", "BASE=debian:bookworm", "no `ARG BASE="),
        ("FROM ${BASE}", "FROM python:3.11-slim-bookworm", "not ${BASE}"),
        ("USER 65532:65532", "USER 0", "not a numeric non-root uid"),
        ("USER 65532:65532", "USER 0:0", "not a numeric non-root uid"),
        ("USER 65532:65532", "USER app", "not a numeric non-root uid"),
        ("USER 65532:65532", "USER 65532:app", "not a numeric non-root uid"),
        ("USER 65532:65532\n", "", "sets no USER"),
        (
            'ENTRYPOINT ["/opt/venv/bin/python", "-m", "app"]',
            "ENTRYPOINT /opt/venv/bin/python -m app",
            "shell form",
        ),
        (
            'ENTRYPOINT ["/opt/venv/bin/python", "-m", "app"]',
            "CMD /opt/venv/bin/python -m app",
            "no ENTRYPOINT",
        ),
        ("USER 65532:65532", "HEALTHCHECK CMD true\nUSER 65532:65532", "HEALTHCHECK"),
        (
            "COPY requirements.lock /tmp/requirements.lock",
            "COPY . /src",
            "comes before the dependency install",
        ),
        (
            "COPY requirements.lock /tmp/requirements.lock",
            "COPY requirements.lock app /tmp/",
            "COPY app comes before",
        ),
        ("--requirement /tmp/requirements.lock", "kopf", "no RUN installs the locked"),
        ("--require-hashes ", "", "without --require-hashes"),
        ("COPY app /src/app\n", "", ""),  # pyproject.toml is still copied after: fine
    ],
)
def test_each_broken_rule_is_reported(old: str, new: str, expected: str, check: Check) -> None:
    assert old in GOOD
    found = check(GOOD.replace(old, new))
    if expected:
        assert any(expected in v for v in found), found
    else:
        assert found == []


def test_code_copied_after_the_install_is_required(check: Check) -> None:
    only_deps = GOOD.split("COPY pyproject.toml")[0] + 'USER 1\nENTRYPOINT ["/x"]\n'
    assert check(only_deps) == ["no COPY of the code after the dependency install"]


def test_only_the_final_stage_counts_for_user_and_entrypoint(check: Check) -> None:
    builder_then_root = GOOD.replace(
        "USER 65532:65532\nENTRYPOINT",
        "USER 65532:65532\nFROM ${BASE}\nCOPY --from=0 /opt/venv /opt/venv\nENTRYPOINT",
    )
    found = check(builder_then_root)
    assert any("sets no USER" in v for v in found)


def test_parser_joins_continuations_and_skips_comments(parse: Callable[[str], list]) -> None:
    instructions = parse(
        "# comment\n\nfrom ${BASE}\nRUN a \\\n# inside a continuation\n    && b\nUSER 1\n"
    )
    assert [(i.keyword, i.arguments, i.line) for i in instructions] == [
        ("FROM", "${BASE}", 3),
        ("RUN", "a && b", 4),
        ("USER", "1", 7),
    ]


def test_parser_tells_exec_form_from_shell_form(parse: Callable[[str], list]) -> None:
    exec_form, shell_form, broken = parse('CMD ["a", "b c"]\nCMD a "b c"\nCMD ["a", 1]\n')
    assert exec_form.exec_form() == ["a", "b c"]
    assert shell_form.exec_form() is None
    assert broken.exec_form() is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("FROM x\nRUN a \\\n", "ends inside a line continuation"),
        ("FROM x\nRUN <<EOF\necho\nEOF\n", "heredocs"),
        ("FROM x\n--weird y\n", "is not an instruction"),
    ],
)
def test_parser_refuses_what_it_cannot_read(
    text: str, message: str, parse: Callable[[str], list], dockerfile_error: type[Exception]
) -> None:
    with pytest.raises(dockerfile_error, match=message):
        parse(text)
