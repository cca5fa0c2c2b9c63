"""The cluster's registry, for real: distribution v3 on loopback with htpasswd auth
and TLS from a CA made by localcluster/pki.py, pushed to and pulled from by podman
and helm with the credentials localcluster keeps.

A tiny image (one file, `podman import`ed into a podman store of the test's own)
stands in for the project's images so the test stays quick beside the e2e tier;
the chart is the project's real one. The registry binary and its htpasswd helper
are built by `make setup` (build-binaries.sh) and linked as .cache/registry.
"""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
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
    HELM_BINARY,
    Credentials,
    Endpoint,
    RegistryError,
    chart_repository,
    prepare,
    pull_secret,
    push_images,
    v2_status,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def registry(workdir: Path) -> Iterator[Registry]:
    endpoint = Endpoint("127.0.0.1", free_port())
    with serving(registry_paths(workdir, "cluster"), endpoint, workdir / "registry.log") as up:
        yield up


@pytest.fixture(scope="module")
def pushed(registry: Registry, workdir: Path) -> dict[str, str]:
    """The CLI's `push` of the tiny image and the real chart: reference -> digest."""
    push_cache = workdir / "push"
    tiny_image(push_cache)
    done = subprocess.run(
        [
            sys.executable, "-m", "localcluster.registry",
            "--state", str(registry.paths.state.parent), "--address", registry.endpoint.address,
            "push", TINY_IMAGE,
        ],
        env={**os.environ, "FUSEBOX_CACHE": str(push_cache)},
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert registry.credentials.password not in done.stdout + done.stderr
    lines = re.findall(r"^registry: pushed (\S+)@(sha256:[0-9a-f]{64})$", done.stdout, re.M)
    return dict(lines)


def _pull(
    registry: Registry, cache: Path, reference: str, authfile: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *podman(cache), "pull", "--quiet", "--authfile", str(authfile),
            "--cert-dir", str(registry.paths.cert_dir), reference,
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _helm(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """helm with config, cache and data of its own and no docker credentials to fall back on."""
    env = {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
        "DOCKER_CONFIG": str(home / "docker"),
    }
    return subprocess.run(
        [str(HELM_BINARY), *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


# ------------------------------------------------------------------ auth and TLS


def test_v2_refuses_a_client_without_credentials(registry: Registry) -> None:
    assert v2_status(registry.endpoint, registry.paths.ca, None) == 401


def test_v2_refuses_a_wrong_password(registry: Registry) -> None:
    wrong = Credentials(registry.credentials.username, registry.credentials.password + "x")
    assert v2_status(registry.endpoint, registry.paths.ca, wrong) == 401


def test_v2_admits_the_cluster_credentials(registry: Registry) -> None:
    assert v2_status(registry.endpoint, registry.paths.ca, registry.credentials) == 200


def test_tls_is_verified_against_the_cluster_ca(registry: Registry, workdir: Path) -> None:
    other = workdir / "other-ca"
    pki.make_ca(other)
    with pytest.raises(RegistryError, match="CERTIFICATE_VERIFY_FAILED"):
        v2_status(registry.endpoint, other / "ca.crt", registry.credentials)


def test_credentials_are_private_kept_across_prepares_and_never_logged(
    registry: Registry, pushed: dict[str, str]
) -> None:
    paths = registry.paths
    assert paths.state.stat().st_mode & 0o777 == 0o700
    for private in (paths.credentials, paths.htpasswd, paths.config, paths.auth_file):
        assert private.stat().st_mode & 0o777 == 0o600, private
    htpasswd = paths.htpasswd.read_text()
    assert prepare(paths, registry.endpoint) == registry.credentials
    assert paths.htpasswd.read_text() == htpasswd
    assert registry.credentials.password not in registry.log.read_text()


def test_server_certificate_follows_a_new_ca_and_new_names(workdir: Path) -> None:
    paths = registry_paths(workdir, "reissued")
    endpoint = Endpoint("127.0.0.1", 5000)
    prepare(paths, endpoint)
    pki.make_ca(paths.pki)  # the cluster's PKI made again, the names unchanged
    prepare(paths, endpoint)
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", str(paths.ca), str(paths.server_cert)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    prepare(paths, endpoint, extra_names=("registry.fusebox.test",))
    names = subprocess.run(
        ["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", str(paths.server_cert)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "DNS:registry.fusebox.test" in names and "IP Address:127.0.0.1" in names


def test_a_damaged_credentials_file_is_named_and_not_quoted(workdir: Path) -> None:
    paths = registry_paths(workdir, "damaged")
    paths.state.mkdir(parents=True)
    paths.credentials.write_text('{"username": "fusebox", "password": "half-writ')
    with pytest.raises(RegistryError, match="is not a credentials file") as raised:
        prepare(paths, Endpoint("127.0.0.1", 5000))
    assert "half-writ" not in str(raised.value)


def test_pull_secret_auth_is_admitted_by_the_registry(registry: Registry) -> None:
    secret = pull_secret("regcred", "default", registry.endpoint, registry.credentials)
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    auth = config["auths"][registry.endpoint.address]["auth"]
    request = urllib.request.Request(
        f"{registry.endpoint.url}/v2/", headers={"Authorization": f"Basic {auth}"}
    )
    context = ssl.create_default_context(cafile=str(registry.paths.ca))
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        assert response.status == 200


def test_cli_prints_the_pull_secret(registry: Registry) -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "localcluster.registry",
            "--state", str(registry.paths.state.parent), "--address", registry.endpoint.address,
            "pull-secret", "--name", "regcred", "--namespace", "fusebox-system",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    secret = json.loads(done.stdout)
    assert secret == pull_secret(
        "regcred", "fusebox-system", registry.endpoint, registry.credentials
    )


# ------------------------------------------------------------------ images


def test_pushed_image_pulls_back_with_credentials_and_the_same_digest(
    registry: Registry, pushed: dict[str, str], workdir: Path
) -> None:
    reference = f"{registry.endpoint.address}/fusebox/registry-test:tiny"
    assert reference in pushed, pushed
    pull_cache = workdir / "pull"
    done = _pull(registry, pull_cache, reference, registry.paths.auth_file)
    assert done.returncode == 0, done.stderr
    inspect = subprocess.run(
        [*podman(pull_cache), "image", "inspect", "--format", "{{.Digest}}", reference],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert inspect.stdout.strip() == pushed[reference]


def test_pull_without_credentials_is_refused(
    registry: Registry, pushed: dict[str, str], workdir: Path
) -> None:
    reference = f"{registry.endpoint.address}/fusebox/registry-test:tiny"
    assert reference in pushed
    no_auth = workdir / "no-auth.json"
    no_auth.write_text('{"auths": {}}')
    done = _pull(registry, workdir / "anon", reference, no_auth)
    assert done.returncode != 0
    assert "authentication required" in done.stderr


def test_cli_reports_an_image_that_was_never_built(registry: Registry, workdir: Path) -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "localcluster.registry",
            "--state", str(registry.paths.state.parent), "--address", registry.endpoint.address,
            "push", "localhost/fusebox/never-built:none",
        ],
        env={**os.environ, "FUSEBOX_CACHE": str(workdir / "push")},
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "pushing localhost/fusebox/never-built:none failed" in done.stderr
    assert "Traceback" not in done.stderr


# ------------------------------------------------------------------ the chart


def test_chart_pulls_back_after_helm_login_with_the_ca(
    registry: Registry, pushed: dict[str, str], workdir: Path
) -> None:
    chart = f"{chart_repository(registry.endpoint)}/fusebox"
    [(reference, digest)] = [(r, d) for r, d in pushed.items() if r.startswith(chart)]
    version = reference.rsplit(":", 1)[1]
    home = workdir / "helm-user"
    login = subprocess.run(
        [
            str(HELM_BINARY), "registry", "login", registry.endpoint.address,
            "--username", registry.credentials.username, "--password-stdin",
            "--ca-file", str(registry.paths.ca),
        ],
        input=registry.credentials.password, capture_output=True, text=True, timeout=60,
        check=False,
        env={**os.environ, "HELM_CONFIG_HOME": str(home / "config"),
             "DOCKER_CONFIG": str(home / "docker")},
    )  # fmt: skip
    assert login.returncode == 0, login.stderr
    out = workdir / "pulled-chart"
    out.mkdir()
    pulled = _helm(
        home, "pull", chart, "--version", version, "--ca-file", str(registry.paths.ca),
        "--destination", str(out),
    )  # fmt: skip
    assert pulled.returncode == 0, pulled.stderr
    assert f"Digest: {digest}" in pulled.stdout + pulled.stderr
    with tarfile.open(out / f"fusebox-{version}.tgz") as archive:
        member = archive.extractfile("fusebox/Chart.yaml")
        assert member is not None
        assert f"version: {version}" in member.read().decode()


def test_chart_pull_without_login_is_refused(
    registry: Registry, pushed: dict[str, str], workdir: Path
) -> None:
    chart = f"{chart_repository(registry.endpoint)}/fusebox"
    assert any(r.startswith(chart) for r in pushed)
    out = workdir / "anonymous-chart"
    out.mkdir()
    pulled = _helm(
        workdir / "helm-anonymous", "pull", chart, "--ca-file", str(registry.paths.ca),
        "--destination", str(out),
    )  # fmt: skip
    assert pulled.returncode != 0
    # helm's client answers the registry's 401 Basic challenge with this when it has no login.
    assert "basic credential not found" in pulled.stderr


# ------------------------------------------------------------------ storage


def test_pushed_layers_survive_a_registry_restart(workdir: Path) -> None:
    paths = registry_paths(workdir, "restarted")
    cache = workdir / "rst"
    image = tiny_image(cache)
    first = Endpoint("127.0.0.1", free_port())
    with serving(paths, first, workdir / "restarted.log"):
        [digest] = push_images(podman(cache), [image], first, paths).values()
    second = Endpoint("127.0.0.1", free_port())
    with serving(paths, second, workdir / "restarted.log") as again:
        request = urllib.request.Request(
            f"{second.url}/v2/fusebox/registry-test/manifests/tiny",
            method="HEAD",
            headers={
                "Authorization": f"Basic {again.credentials.basic_auth}",
                "Accept": "application/vnd.oci.image.manifest.v1+json, "
                "application/vnd.docker.distribution.manifest.v2+json",
            },
        )
        context = ssl.create_default_context(cafile=str(paths.ca))
        try:
            with urllib.request.urlopen(request, timeout=10, context=context) as response:
                assert response.headers["Docker-Content-Digest"] == digest
        except urllib.error.HTTPError as err:
            pytest.fail(f"the manifest pushed before the restart is gone: {err.code}")
