"""Every lock file pins each distribution by version and by its archive's sha256,
and the three locks agree: an install (the dev environment, each image) then
refuses any file other than the one `make lock` resolved."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
LOCKS = ("requirements-dev.lock", "inference_image/requirements.lock", "operator/requirements.lock")
PIN = re.compile(
    r"^(?P<name>[a-z0-9][a-z0-9._-]*)==(?P<version>\S+) --hash=sha256:(?P<digest>[0-9a-f]{64})$"
)


def pins(path: Path) -> dict[str, tuple[str, str]]:
    """name -> (version, sha256) of every pin; a line that is neither a comment nor a
    hashed pin fails the test, naming it."""
    found = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"{path.name}:{number}: not `name==version --hash=sha256:...`: {line!r}"
        found[match["name"]] = (match["version"], match["digest"])
    return found


@pytest.mark.parametrize("lock", LOCKS)
def test_each_pin_carries_its_archives_sha256(lock: str) -> None:
    assert pins(REPO / lock)


@pytest.mark.parametrize("lock", LOCKS[1:])
def test_an_image_lock_pins_the_dev_environments_archives(lock: str) -> None:
    dev = pins(REPO / LOCKS[0])
    image = pins(REPO / lock)
    assert {name: pin for name, pin in image.items() if dev.get(name) != pin} == {}


def test_a_line_without_its_hash_is_named(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text("# header\nkopf==1.38.0\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="requirements.lock:2"):
        pins(lock)
