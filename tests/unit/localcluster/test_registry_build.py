"""The registry's build section in build-binaries.sh: a cache key of its own that
covers everything it builds from, and no effect on the other sections' keys."""

from __future__ import annotations

import re
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "localcluster" / "build-binaries.sh"
START = "# --- registry (the authenticated"
END = "# --- end of the registry"


def _marker_line(text: str, marker: str) -> int:
    """Where the line starting with `marker` begins (the sed ranges quote it mid-line)."""
    return text.index(f"\n{marker}") + 1


def _section() -> str:
    text = SCRIPT.read_text()
    return text[_marker_line(text, START) : _marker_line(text, END)]


def test_registry_key_hashes_its_section_pins_and_helper_source() -> None:
    [key] = re.findall(r"registry_pins=\$\((.*?)\| sha256sum", _section(), re.S)
    assert f"'/^{START}/,/^{END}/p' build-binaries.sh" in key
    for source in ("registry/go.mod", "registry/go.sum", "registry/htpasswd/*.go"):
        assert source in key


def test_registry_builds_into_its_own_cache_dir_linked_as_cache_registry() -> None:
    section = _section()
    assert 'registry_out="$cache/registry-$registry_pins"' in section
    assert 'ln -sfn "$registry_out" "$root/.cache/registry"' in section
    assert '-o "$tmp/registry" github.com/distribution/distribution/v3/cmd/registry' in section
    assert '-o "$tmp/htpasswd" ./htpasswd' in section


def test_no_key_that_runs_to_the_end_of_the_file_sees_the_registry_section() -> None:
    """containerd's key hashes from its marker to the end of the file: the registry
    section must come before it, or every registry change rebuilds containerd."""
    text = SCRIPT.read_text()
    to_end = re.findall(r"sed -n '/\^(# --- [^/]*)/,\$p'", text)
    assert to_end, "no key runs to the end of the file any more; this test can go"
    for marker in to_end:
        assert _marker_line(text, marker) > _marker_line(text, END), marker
