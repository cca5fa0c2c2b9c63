"""The node's side: containerd, given the `hosts.toml` that `containerd_hosts` writes,
trusts the registry's CA and still needs credentials for every pull.

A containerd of the version the cluster runs (.cache/containerd, built by
build-binaries.sh) is started with its own socket and root under the test's
directory and no CRI; `ctr content fetch --hosts-dir` reads the hosts directory
with the same resolver the CRI uses for `config_path`. containerd skips TLS
verification for a loopback registry that has no hosts file, so the proof that the
file's `ca` is what it trusts is a hosts file naming another CA: refused.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from registry_harness import (
    TINY_IMAGE,
    Registry,
    free_port,
    podman,
    registry_paths,
    serving,
    tiny_image,
)

from localcluster import pki
from localcluster.registry import (
    REPO_ROOT,
    Endpoint,
    containerd_hosts,
    image_reference,
    push_images,
)

pytestmark = pytest.mark.integration

CONTAINERD_DIR = REPO_ROOT / ".cache" / "containerd"
HOST = "127.0.0.1"


def _containerd_config(root: Path) -> str:
    """A containerd that only stores content: no CRI, no NRI, nothing outside `root`."""
    return f"""version = 3
root = '{root}/root'
state = '{root}/state'
imports = []
disabled_plugins = ['io.containerd.grpc.v1.cri', 'io.containerd.cri.v1.images',
  'io.containerd.cri.v1.runtime', 'io.containerd.nri.v1.nri',
  'io.containerd.snapshotter.v1.aufs', 'io.containerd.snapshotter.v1.btrfs',
  'io.containerd.snapshotter.v1.zfs', 'io.containerd.snapshotter.v1.devmapper']

[grpc]
  address = '{root}/containerd.sock'

[ttrpc]
  address = '{root}/containerd.sock.ttrpc'

[plugins.'io.containerd.internal.v1.opt']
  path = '{root}/opt'
"""


@pytest.fixture(scope="module")
def registry(workdir: Path) -> Iterator[Registry]:
    paths = registry_paths(workdir, "node")
    endpoint = Endpoint(HOST, free_port(HOST))
    with serving(paths, endpoint, workdir / "node-registry.log") as up:
        cache = workdir / "ctrd"
        push_images(podman(cache), [tiny_image(cache)], endpoint, paths)
        yield up


@pytest.fixture(scope="module")
def ctr(workdir: Path) -> Iterator[list[str]]:
    binary = CONTAINERD_DIR / "containerd"
    assert binary.is_file(), f"{binary} is missing: run `make setup-binaries`"
    root = workdir / "containerd"
    root.mkdir()
    config = root / "config.toml"
    config.write_text(_containerd_config(root))
    socket = root / "containerd.sock"
    with open(workdir / "containerd.log", "w") as log:
        daemon = subprocess.Popen(
            [str(binary), "--config", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
    client = [str(CONTAINERD_DIR / "ctr"), "--address", str(socket)]
    try:
        deadline = time.monotonic() + 30
        while subprocess.run([*client, "version"], capture_output=True).returncode != 0:
            assert daemon.poll() is None, (workdir / "containerd.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "containerd did not serve within 30 s"
            time.sleep(0.2)
        yield client
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)


def _fetch(ctr: list[str], registry: Registry, *options: str) -> subprocess.CompletedProcess[str]:
    reference = image_reference(TINY_IMAGE, registry.endpoint)
    return subprocess.run(
        [*ctr, "content", "fetch", *options, reference],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _hosts_dir(registry: Registry, workdir: Path) -> Path:
    config_path = workdir / "certs.d"
    hosts = containerd_hosts(config_path, registry.endpoint, registry.paths.ca)
    hosts.path.parent.mkdir(parents=True, exist_ok=True)
    hosts.path.write_text(hosts.text)
    return config_path


def _user(registry: Registry) -> str:
    # ctr takes the password only in its argv; this is a throwaway test registry.
    return f"{registry.credentials.username}:{registry.credentials.password}"


def test_containerd_pulls_with_the_hosts_file_and_credentials(
    ctr: list[str], registry: Registry, workdir: Path
) -> None:
    hosts_dir = _hosts_dir(registry, workdir)
    done = _fetch(ctr, registry, "--hosts-dir", str(hosts_dir), "--user", _user(registry))
    assert done.returncode == 0, done.stderr


def test_containerd_refuses_the_registry_under_another_ca(
    ctr: list[str], registry: Registry, workdir: Path
) -> None:
    other = workdir / "other-pki"
    pki.make_ca(other)
    config_path = workdir / "other.d"
    hosts = containerd_hosts(config_path, registry.endpoint, other / "ca.crt")
    hosts.path.parent.mkdir(parents=True)
    hosts.path.write_text(hosts.text)
    done = _fetch(ctr, registry, "--hosts-dir", str(config_path), "--user", _user(registry))
    assert done.returncode != 0
    assert "certificate signed by unknown authority" in done.stderr


def test_the_hosts_file_grants_no_credentials(
    ctr: list[str], registry: Registry, workdir: Path
) -> None:
    done = _fetch(ctr, registry, "--hosts-dir", str(_hosts_dir(registry, workdir)))
    assert done.returncode != 0
    assert "no basic auth credentials" in done.stderr
