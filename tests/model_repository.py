"""A model directory as a git repository: one commit, tagged, as a hub mirror serves it.

Why here, at the top of tests/: the integration tier (olah on loopback) and the
e2e tier (olah as a pod) both hand the hub mirror the same repository, made
the same way; neither tier imports the other's modules, so the one copy
lives above both.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def git(repo: Path, *args: str) -> str:
    """`git ARGS` in `repo` with a fixed author, so a test needs no git identity set up."""
    done = subprocess.run(
        ["git", "-c", "user.name=fusebox", "-c", "user.email=tests@fusebox.dev", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def commit_model(repo: Path, model_dir: Path, tag: str) -> str:
    """A new repository at `repo` holding `model_dir`'s files in one commit tagged `tag`;
    returns the commit the tag points at."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    for path in sorted(model_dir.iterdir()):
        shutil.copy(path, repo / path.name)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "the tiny model")
    git(repo, "tag", tag)
    return git(repo, "rev-parse", tag)
