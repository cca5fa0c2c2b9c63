"""hf:// model sources against a real hub-compatible server: the olah mirror on loopback.

olah (PyPI 0.5.4, in its own environment built by `make setup`, linked as
.cache/olah) serves a local git repository offline, holding the tiny model with
a tag; the fetcher reaches it through HF_ENDPOINT exactly as it would the hub,
resolves the tag to its commit hash, verifies each file against the git blob id
the tree API lists, and the real server answers from what it fetched. Nothing
leaves the machine: olah runs with `offline = true`.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from fetch_harness import FetchRun, finished, pod_link, serving, start_fetch
from fusebox_server_harness import ServerProcess, free_port

from fusebox_contract.model_fetch import FetchEnv, FetchReason

from ...model_repository import commit_model

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
OLAH = ROOT / ".cache" / "olah" / "bin" / "olah-cli"
ORG, REPO, TAG = "fusebox", "tiny", "v1"


@dataclass(frozen=True)
class Hub:
    endpoint: str
    commit: str  # what TAG points at


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fusebox-hub-tests-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def hub(workdir: Path, tiny_model_dir: Path) -> Iterator[Hub]:
    assert OLAH.is_file(), f"{OLAH} is missing: run `make setup` (build-binaries.sh)"
    commit = commit_model(workdir / "mirrors" / "models" / ORG / REPO, tiny_model_dir, TAG)
    port = free_port()
    config = workdir / "olah.toml"
    config.write_text(
        "[basic]\n"
        'host = "127.0.0.1"\n'
        f"port = {port}\n"
        f'repos-path = "{workdir / "olah-cache"}"\n'
        f'mirrors-path = ["{workdir / "mirrors"}"]\n'
        "[accessibility]\n"
        "offline = true\n"
    )
    endpoint = f"http://127.0.0.1:{port}"

    def answering() -> bool:
        try:
            url = f"{endpoint}/api/models/{ORG}/{REPO}/revision/main"
            return httpx.get(url, timeout=2).is_success
        except httpx.TransportError:
            return False

    with serving([str(OLAH), "-c", str(config)], workdir, "olah", answering, seconds=60):
        yield Hub(endpoint, commit)


def fetch(hub: Hub, source: str, model_dir: Path, revision: str = "main") -> FetchRun:
    settings = {
        FetchEnv.SOURCE: source,
        FetchEnv.REVISION: revision,
        FetchEnv.HF_ENDPOINT: hub.endpoint,
        "HF_HOME": str(model_dir.parent / "hf-home"),
    }
    process = start_fetch(model_dir, settings, scrubbed=("HF_", "TRANSFORMERS_OFFLINE"))
    return finished(process, model_dir)


def test_a_hub_model_at_a_tag_is_fetched_at_its_commit_verified_and_served(
    hub: Hub, workdir: Path, tiny_model_dir: Path
) -> None:
    model_dir = workdir / "served" / "model"
    run = fetch(hub, f"hf://{ORG}/{REPO}@{TAG}", model_dir)
    assert run.returncode == 0, run.output
    assert run.report.reason is FetchReason.VERIFIED
    assert run.report.revision == hub.commit  # the tag resolved to its commit hash
    assert run.report.bytes_total == sum(p.stat().st_size for p in tiny_model_dir.iterdir())
    # The copy is the commit's own directory, and the pod's link (what the server loads)
    # names it.
    assert pod_link(model_dir).resolve() == (model_dir / "revisions" / hub.commit).resolve()
    for path in tiny_model_dir.iterdir():
        assert (pod_link(model_dir) / path.name).read_bytes() == path.read_bytes()
    server = ServerProcess(workdir / "server", pod_link(model_dir), {"max-new-tokens": 8}, {})
    try:
        server.wait_ready()
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert reply.usage is not None and reply.usage.completion_tokens > 0
    finally:
        server.stop()
    again = fetch(hub, f"hf://{ORG}/{REPO}@{TAG}", model_dir)
    assert again.returncode == 0 and again.report.cached
    assert again.report.revision == hub.commit


def test_the_spec_revision_is_used_when_the_source_pins_none(hub: Hub, workdir: Path) -> None:
    run = fetch(hub, f"hf://{ORG}/{REPO}", workdir / "by-revision" / "model", revision=TAG)
    assert run.returncode == 0, run.output
    assert run.report.revision == hub.commit


@pytest.mark.parametrize(
    ("source", "revision"),
    [(f"hf://{ORG}/absent", "main"), (f"hf://{ORG}/{REPO}", "no-such-revision")],
)
def test_a_missing_repository_or_revision_is_not_found(
    hub: Hub, workdir: Path, source: str, revision: str
) -> None:
    model_dir = Path(tempfile.mkdtemp(dir=workdir)) / "model"
    run = fetch(hub, source, model_dir, revision)
    assert run.returncode == 1
    assert run.report.reason is FetchReason.NOT_FOUND
    assert "not found" in run.report.message
