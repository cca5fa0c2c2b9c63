"""What the registry integration tests share: the real registry served on loopback
from a fresh CA, a one-file image in a podman store of the test's own, and the
cleanup podman's storage needs."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from localcluster import images, pki
from localcluster.registry import (
    REGISTRY_BINARY,
    Credentials,
    Endpoint,
    RegistryError,
    RegistryPaths,
    paths_for,
    prepare,
    serve_argv,
    serve_env,
    wait_ready,
)

TINY_IMAGE = "localhost/fusebox/registry-test:tiny"
TINY_FILE = b"pulled through the cluster's registry\n"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def unmount_under(path: Path) -> None:
    """podman's overlay driver bind-mounts its storage root; undo it before rm -rf."""
    with open("/proc/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    for point in sorted((p for p in points if p.startswith(f"{path}/")), reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False)


@dataclass(frozen=True)
class Registry:
    paths: RegistryPaths
    endpoint: Endpoint
    credentials: Credentials
    log: Path


def registry_paths(workdir: Path, name: str) -> RegistryPaths:
    """A cluster's registry paths under `workdir/name`, with a new CA in its pki dir."""
    state = workdir / name / "state"
    pki.make_ca(state / "pki")
    return paths_for(state_dir=state, cache=workdir / name / "cache", cluster_name=name)


@contextmanager
def serving(paths: RegistryPaths, endpoint: Endpoint, log: Path) -> Iterator[Registry]:
    """The registry prepared and running at `endpoint` until the block ends."""
    assert REGISTRY_BINARY.is_file(), f"{REGISTRY_BINARY} is missing: run `make setup-binaries`"
    credentials = prepare(paths, endpoint)
    with open(log, "a") as sink:
        process = subprocess.Popen(
            serve_argv(paths), env=serve_env(os.environ), stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        try:
            wait_ready(endpoint, paths.ca, credentials, timeout_seconds=30, process=process)
        except RegistryError as err:
            pytest.fail(f"{err}\n{log.read_text()[-3000:]}")
        yield Registry(paths, endpoint, credentials, log)
    finally:
        process.terminate()
        process.wait(timeout=30)


def podman(cache: Path) -> list[str]:
    """The project's podman invocation (images.podman_argv) over a store of the test's own."""
    return images.podman_argv(cache)


def tiny_image(cache: Path) -> str:
    """A one-file image, imported from a tar: no build, no base, under a second."""
    rootfs = cache / "rootfs.tar"
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(rootfs, "w") as archive:
        info = tarfile.TarInfo("hello.txt")
        info.size = len(TINY_FILE)
        archive.addfile(info, io.BytesIO(TINY_FILE))
    done = subprocess.run(
        [*podman(cache), "import", "--quiet", str(rootfs), TINY_IMAGE],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return TINY_IMAGE
