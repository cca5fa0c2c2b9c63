"""The cluster's authenticated OCI registry: what users pull from, run here.

A platform team's cluster pulls its images and charts from a private registry
with credentials; a cluster fed by `ctr images import` never proves that a pod
with a pull secret starts and one without it fails. So localcluster runs the
CNCF distribution registry v3 (built by build-binaries.sh, linked as
.cache/registry) the way such a registry runs: htpasswd (bcrypt) auth, TLS
with a server certificate from the cluster's own CA (localcluster/pki.py),
and layers on the filesystem under the cache, so what was pushed survives
`down`/`up`.

This module holds every piece of that, and starts nothing on its own: the
pure parts (the registry's config, its argv, the containerd `hosts.toml`
that makes the node trust it, the dockerconfigjson pull Secret, image and
chart references) and the I/O edges (credentials kept 0600 in the state dir,
the server certificate, the readiness probe, pushing images with podman and
the chart with helm). localcluster's process wiring starts the registry with
`serve_argv`/`serve_env` and points containerd's `config_path` at the
directory `containerd_hosts` names. docs/decisions/registry.md says why.

The password never reaches an argv or a log: podman and helm read it from an
auth file, the htpasswd helper from standard input.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import ipaddress
import json
import os
import re
import secrets
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localcluster import images, pki

REPO_ROOT = Path(__file__).resolve().parent.parent
REGISTRY_BIN_DIR = REPO_ROOT / ".cache" / "registry"
REGISTRY_BINARY = REGISTRY_BIN_DIR / "registry"
# Writes one bcrypt htpasswd line; built beside the registry (registry/htpasswd).
HTPASSWD_BINARY = REGISTRY_BIN_DIR / "htpasswd"
HELM_BINARY = REPO_ROOT / ".cache" / "bin" / "helm"
CHART_DIR = REPO_ROOT / "helm" / "fusebox"

USERNAME = "fusebox"
REALM = "fusebox-localcluster"
CERT_NAME = "registry"  # <pki>/registry.crt and registry.key, signed by <pki>/ca.crt
LOCAL_PREFIX = "localhost/"  # podman's name for the project's images: localhost/fusebox/X:T
CHART_REPOSITORY = "charts"  # the chart lives at oci://HOST:PORT/charts/fusebox
PULL_SECRET_TYPE = "kubernetes.io/dockerconfigjson"
PULL_SECRET_KEY = ".dockerconfigjson"


class RegistryError(RuntimeError):
    """Preparing, probing or pushing to the registry failed; the message says why."""


# ---------------------------------------------------------------- pure parts


@dataclass(frozen=True)
class Endpoint:
    """Where the registry listens and clients reach it: a host (name or IP) and port."""

    host: str
    port: int

    def __post_init__(self) -> None:
        malformed = any(c in self.host for c in "/[] ") or (
            ":" in self.host and not _is_ipv6(self.host)
        )
        if not self.host or malformed:
            raise ValueError(f"registry host {self.host!r} is not a host name or IP address")
        if not 0 < self.port < 65536:
            raise ValueError(f"registry port {self.port} is outside 1-65535")

    @property
    def address(self) -> str:
        """`host:port` as registries and containerd name it (`[::1]:5000` for IPv6)."""
        host = f"[{self.host}]" if _is_ipv6(self.host) else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"https://{self.address}"


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


@dataclass(frozen=True)
class Credentials:
    """The registry's one user. The password is left out of repr so it is never logged."""

    username: str
    password: str = field(repr=False)

    @property
    def basic_auth(self) -> str:
        """base64 of `user:password`: HTTP Basic and the dockerconfigjson `auth` field."""
        return base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


@dataclass(frozen=True)
class RegistryPaths:
    """Where one cluster's registry keeps its files.

    `state`: credentials, htpasswd, config, auth file (per cluster, 0700, removed
    with the cluster). `storage`: the pushed layers, in the cache so they survive
    `down`/`up`. `pki`: the cluster's CA directory; the server certificate is
    issued into it beside the others.
    """

    state: Path
    storage: Path
    pki: Path

    @property
    def config(self) -> Path:
        return self.state / "config.yml"

    @property
    def htpasswd(self) -> Path:
        return self.state / "htpasswd"

    @property
    def credentials(self) -> Path:
        return self.state / "credentials.json"

    @property
    def auth_file(self) -> Path:
        """A docker config.json with the credentials: podman's --authfile, helm's
        --registry-config."""
        return self.state / "auth.json"

    @property
    def cert_dir(self) -> Path:
        """podman's --cert-dir: a directory whose *.crt files are the CAs it trusts."""
        return self.state / "certs"

    @property
    def cert_stamp(self) -> Path:
        """The extensions the server certificate was issued with (reissued on change)."""
        return self.state / "server-cert.ext"

    @property
    def ca(self) -> Path:
        return self.pki / f"{pki.CA_NAME}.crt"

    @property
    def server_cert(self) -> Path:
        return self.pki / f"{CERT_NAME}.crt"

    @property
    def server_key(self) -> Path:
        return self.pki / f"{CERT_NAME}.key"


def paths_for(*, state_dir: Path, cache: Path, cluster_name: str) -> RegistryPaths:
    """A cluster's registry paths: `<state>/registry`, `<cache>/oci-registry/<name>`
    and the cluster's `<state>/pki`. Pure."""
    return RegistryPaths(
        state=state_dir / "registry",
        storage=cache / "oci-registry" / cluster_name,
        pki=state_dir / "pki",
    )


def server_cert_spec(endpoint: Endpoint, *, extra_names: Sequence[str] = ()) -> pki.CertSpec:
    """The registry's server certificate: it names the endpoint's host (and any
    other name or IP clients use), so TLS verifies with the cluster's CA. Pure."""
    names = [endpoint.host, *extra_names]
    ips = tuple(dict.fromkeys(n for n in names if _is_ip(n)))
    dns = tuple(dict.fromkeys(n for n in names if not _is_ip(n)))
    return pki.CertSpec(CERT_NAME, "fusebox-registry", dns_names=dns, ip_addresses=ips, server=True)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def config_text(paths: RegistryPaths, listen: Endpoint, *, http_secret: str) -> str:
    """distribution's config.yml: filesystem storage, htpasswd auth, TLS. Pure.

    Strings are written as JSON strings, which YAML reads as double-quoted
    scalars, so no path needs escaping by hand.
    """

    def q(value: object) -> str:
        return json.dumps(str(value))

    return f"""version: 0.1
log:
  level: info
  fields:
    service: registry
storage:
  filesystem:
    rootdirectory: {q(paths.storage)}
  cache:
    blobdescriptor: inmemory
  # Pushed layers are the point of keeping the storage: nothing deletes them.
  delete:
    enabled: false
auth:
  htpasswd:
    realm: {q(REALM)}
    path: {q(paths.htpasswd)}
http:
  addr: {q(listen.address)}
  # Signs upload state; without one the registry makes a random one and warns.
  secret: {q(http_secret)}
  headers:
    X-Content-Type-Options: [nosniff]
  tls:
    certificate: {q(paths.server_cert)}
    key: {q(paths.server_key)}
    minimumtls: tls1.2
health:
  storagedriver:
    enabled: true
    interval: 10s
    threshold: 3
"""


def serve_argv(paths: RegistryPaths, binary: Path = REGISTRY_BINARY) -> list[str]:
    """The command that runs the registry with its config. Pure."""
    return [str(binary), "serve", str(paths.config)]


def serve_env(base: Mapping[str, str]) -> dict[str, str]:
    """The registry's environment: `base` with its OpenTelemetry exporter off, which
    otherwise sends traces to https://localhost:4318 (nothing listens there). Pure.

    Any REGISTRY_* variable in `base` is dropped: distribution reads those as
    overrides of its config, and this cluster's settings are all in config.yml.
    """
    env = {k: v for k, v in base.items() if not k.startswith("REGISTRY_")}
    env["OTEL_TRACES_EXPORTER"] = "none"
    return env


def htpasswd_line_is_bcrypt(line: str, username: str) -> bool:
    """Whether `line` is `username:<bcrypt hash>`, the only form distribution reads. Pure."""
    user, _, hashed = line.strip().partition(":")
    return (
        user == username and re.fullmatch(r"\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}", hashed) is not None
    )


def docker_config(endpoint: Endpoint, credentials: Credentials) -> dict[str, Any]:
    """A docker config.json granting `credentials` at the endpoint: the body of a pull
    Secret, podman's --authfile and helm's --registry-config alike. Pure."""
    return {
        "auths": {
            endpoint.address: {
                "username": credentials.username,
                "password": credentials.password,
                "auth": credentials.basic_auth,
            }
        }
    }


def pull_secret(
    name: str, namespace: str, endpoint: Endpoint, credentials: Credentials
) -> dict[str, Any]:
    """A `kubernetes.io/dockerconfigjson` Secret for a pod's imagePullSecrets. Pure."""
    encoded = json.dumps(docker_config(endpoint, credentials), separators=(",", ":"))
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": PULL_SECRET_TYPE,
        "data": {PULL_SECRET_KEY: base64.b64encode(encoded.encode()).decode()},
    }


@dataclass(frozen=True)
class HostsFile:
    """A containerd registry host file and where it belongs."""

    path: Path
    text: str


def containerd_hosts(config_path: Path, endpoint: Endpoint, ca: Path) -> HostsFile:
    """The `hosts.toml` that makes containerd trust the registry's CA. Pure.

    It belongs at `<config_path>/<host:port>/hosts.toml`, where `config_path` is
    the CRI images plugin's `registry.config_path`. It carries no credentials:
    the kubelet hands the CRI each pod's imagePullSecrets, so a pod without one
    is refused by the registry, as on a real cluster.
    """
    text = (
        "# The cluster's registry (localcluster/registry.py): TLS from the cluster's CA;\n"
        "# credentials come from each pod's imagePullSecrets, never from here.\n"
        f'server = "{endpoint.url}"\n\n'
        f'[host."{endpoint.url}"]\n'
        '  capabilities = ["pull", "resolve"]\n'
        f"  ca = {json.dumps(str(ca))}\n"
    )
    return HostsFile(config_path / endpoint.address / "hosts.toml", text)


def image_reference(local_name: str, endpoint: Endpoint) -> str:
    """`localhost/fusebox/operator:dev` -> `HOST:PORT/fusebox/operator:dev`. Pure."""
    if not local_name.startswith(LOCAL_PREFIX) or ":" not in local_name.rsplit("/", 1)[-1]:
        raise ValueError(f"image {local_name!r} is not a local image `localhost/REPOSITORY:TAG`")
    return f"{endpoint.address}/{local_name.removeprefix(LOCAL_PREFIX)}"


def chart_repository(endpoint: Endpoint) -> str:
    """Where `helm push` puts the chart: `oci://HOST:PORT/charts`. Pure."""
    return f"oci://{endpoint.address}/{CHART_REPOSITORY}"


def readiness_problem(status_without_credentials: int, status_with_credentials: int) -> str | None:
    """Why the registry is not ready to serve the cluster, or None when it is. Pure.

    Ready means `/v2/` refuses an anonymous client (401: auth is on) and admits
    the cluster's user (200).
    """
    if status_without_credentials != 401:
        return f"GET /v2/ without credentials answered {status_without_credentials}, not 401"
    if status_with_credentials != 200:
        return (
            f"GET /v2/ with the cluster's credentials answered {status_with_credentials}, not 200"
        )
    return None


def pushed_chart_digest(helm_output: str) -> str:
    """The manifest digest `helm push` reports (`Digest: sha256:...`). Pure."""
    found = re.search(r"^Digest:\s*(sha256:[0-9a-f]{64})\s*$", helm_output, re.MULTILINE)
    if found is None:
        raise RegistryError(f"helm push reported no digest: {helm_output.strip()!r}")
    return found.group(1)


# ---------------------------------------------------------------- I/O edges


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner only, replacing it atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:  # mkstemp creates it 0600
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def ensure_credentials(
    paths: RegistryPaths, htpasswd_binary: Path = HTPASSWD_BINARY
) -> Credentials:
    """The cluster's registry user: read from the state dir, or made once.

    A new password (256 random bits) is kept in `credentials.json` (0600) and
    its bcrypt line written to `htpasswd` by the helper, which reads the
    password from standard input.
    """
    paths.state.mkdir(parents=True, exist_ok=True)
    paths.state.chmod(0o700)
    if paths.credentials.is_file():
        credentials = _stored_credentials(paths.credentials)
    else:
        credentials = Credentials(USERNAME, secrets.token_urlsafe(32))
        _write_private(
            paths.credentials,
            json.dumps({"username": credentials.username, "password": credentials.password}),
        )
        paths.htpasswd.unlink(missing_ok=True)
    if not paths.htpasswd.is_file():
        _write_private(paths.htpasswd, _htpasswd_line(credentials, htpasswd_binary))
    return credentials


def read_credentials(paths: RegistryPaths) -> Credentials:
    """The credentials `prepare` made, read only (a RegistryError when there are none)."""
    if not paths.credentials.is_file():
        raise RegistryError(f"no registry prepared in {paths.state}")
    return _stored_credentials(paths.credentials)


def _stored_credentials(path: Path) -> Credentials:
    try:
        stored = json.loads(path.read_text())
        return Credentials(str(stored["username"]), str(stored["password"]))
    except (ValueError, KeyError, TypeError) as err:
        # The error's text may quote the file; only its type is shown.
        raise RegistryError(
            f"{path} is not a credentials file ({type(err).__name__}); delete it and "
            f"{path.parent / 'htpasswd'} to make new credentials"
        ) from None


def _htpasswd_line(credentials: Credentials, binary: Path) -> str:
    if not binary.is_file():
        raise RegistryError(f"{binary} is missing: run `make setup-binaries`")
    done = subprocess.run(
        [str(binary), credentials.username],
        input=credentials.password,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if done.returncode != 0 or not htpasswd_line_is_bcrypt(done.stdout, credentials.username):
        raise RegistryError(f"{binary} made no bcrypt line: {done.stderr.strip()}")
    return done.stdout


def ensure_server_cert(paths: RegistryPaths, spec: pki.CertSpec) -> None:
    """Issue the server certificate from the CA in `paths.pki`, again when the names
    it must carry or the CA changed (a stale one fails TLS verification with no
    hint why)."""
    if not paths.ca.is_file() or not (paths.pki / f"{pki.CA_NAME}.key").is_file():
        raise RegistryError(f"no CA in {paths.pki}: the cluster's PKI must exist first")
    ca_digest = hashlib.sha256(paths.ca.read_bytes()).hexdigest()
    wanted = f"# issued by the CA with sha256 {ca_digest}\n{pki.extensions_text(spec)}"
    current = paths.cert_stamp.read_text() if paths.cert_stamp.is_file() else None
    if current == wanted and paths.server_cert.is_file() and paths.server_key.is_file():
        return
    pki.issue(paths.pki, spec)
    paths.cert_stamp.write_text(wanted)


def prepare(
    paths: RegistryPaths,
    listen: Endpoint,
    *,
    clients_reach: Endpoint | None = None,
    extra_names: Sequence[str] = (),
    htpasswd_binary: Path = HTPASSWD_BINARY,
) -> Credentials:
    """Everything the registry and its clients need before `serve_argv` runs.

    `listen` is where it binds; `clients_reach` where podman, helm and containerd
    connect (default: the same), which the certificate and auth file name.
    """
    reach = clients_reach or listen
    credentials = ensure_credentials(paths, htpasswd_binary)
    ensure_server_cert(paths, server_cert_spec(reach, extra_names=extra_names))
    paths.storage.mkdir(parents=True, exist_ok=True)
    _write_private(paths.config, config_text(paths, listen, http_secret=secrets.token_hex(32)))
    _write_private(paths.auth_file, json.dumps(docker_config(reach, credentials)))
    paths.cert_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(paths.ca, paths.cert_dir / "ca.crt")
    return credentials


def v2_status(endpoint: Endpoint, ca: Path, credentials: Credentials | None) -> int:
    """The HTTP status of `GET /v2/`, verifying TLS against `ca`.

    Raises RegistryError when nothing answers or TLS fails verification.
    """
    request = urllib.request.Request(f"{endpoint.url}/v2/")
    if credentials is not None:
        request.add_header("Authorization", f"Basic {credentials.basic_auth}")
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        err.close()
        return int(err.code)
    except (urllib.error.URLError, OSError) as err:
        raise RegistryError(f"{endpoint.url}/v2/ did not answer: {err}") from err


def wait_ready(
    endpoint: Endpoint,
    ca: Path,
    credentials: Credentials,
    *,
    timeout_seconds: float,
    process: subprocess.Popen[Any] | None = None,
) -> None:
    """Return once the registry refuses anonymous clients and admits `credentials`.

    Raises RegistryError with the last reason at the deadline, or at once when
    `process` (the registry) has exited.
    """
    deadline = time.monotonic() + timeout_seconds
    problem = "not probed yet"
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RegistryError(f"the registry exited with status {process.returncode}")
        try:
            verdict = readiness_problem(
                v2_status(endpoint, ca, None), v2_status(endpoint, ca, credentials)
            )
        except RegistryError as err:
            verdict = str(err)
        if verdict is None:
            return
        problem = verdict
        time.sleep(0.2)
    raise RegistryError(f"the registry at {endpoint.url} is not ready: {problem}")


def _run(
    what: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run `argv`; a failure, a missing tool or a time-out is a RegistryError naming `what`."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, check=False, env=env, timeout=timeout
        )
    except FileNotFoundError as err:
        raise RegistryError(f"{what}: {argv[0]} is not installed") from err
    except subprocess.TimeoutExpired as err:
        raise RegistryError(f"{what} did not finish in {timeout:.0f} s") from err
    if done.returncode != 0:
        raise RegistryError(f"{what} failed: {done.stderr.strip()}")
    return done


def push_image_argv(
    podman: Sequence[str],
    local_name: str,
    endpoint: Endpoint,
    paths: RegistryPaths,
    digest_file: Path,
) -> list[str]:
    """`podman push` of one local image to the registry, credentials from the auth
    file (not --creds: an argv is readable by every user), TLS from the CA. Pure."""
    return [
        *podman,
        "push",
        "--quiet",
        "--authfile",
        str(paths.auth_file),
        "--cert-dir",
        str(paths.cert_dir),
        "--digestfile",
        str(digest_file),
        local_name,
        f"docker://{image_reference(local_name, endpoint)}",
    ]


def push_images(
    podman: Sequence[str], names: Sequence[str], endpoint: Endpoint, paths: RegistryPaths
) -> dict[str, str]:
    """Push each local image; return registry reference -> pushed manifest digest.

    The registry skips blobs it already holds, so a second push of an unchanged
    image sends only its manifest.
    """
    pushed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="fusebox-push-") as scratch:
        digest_file = Path(scratch) / "digest"
        for name in names:
            argv = push_image_argv(podman, name, endpoint, paths, digest_file)
            _run(f"pushing {name}", argv, timeout=3600)
            pushed[image_reference(name, endpoint)] = digest_file.read_text().strip()
    return pushed


def built_images(podman: Sequence[str], names: Sequence[str]) -> list[str]:
    """The `names` podman holds; each one it lacks is reported on stderr (run `make images`)."""
    built: list[str] = []
    for name in names:
        if subprocess.run([*podman, "image", "exists", name], check=False).returncode == 0:
            built.append(name)
        else:
            print(f"registry: {name} is not built, not pushed (run `make images`)", file=sys.stderr)
    return built


@dataclass(frozen=True)
class PushedChart:
    reference: str  # oci://HOST:PORT/charts/fusebox
    version: str
    digest: str


def helm_env(base: Mapping[str, str], home: Path) -> dict[str, str]:
    """helm's environment with its config, cache and data under `home`, so a push
    neither reads nor writes the user's ~/.config/helm. Pure."""
    return {
        **base,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def push_chart(
    endpoint: Endpoint,
    paths: RegistryPaths,
    *,
    chart_dir: Path = CHART_DIR,
    helm: Path = HELM_BINARY,
) -> PushedChart:
    """`helm package` the chart and `helm push` it to `oci://HOST:PORT/charts`."""
    with tempfile.TemporaryDirectory(prefix="fusebox-chart-") as scratch:
        work = Path(scratch)
        env = helm_env(os.environ, work / "helm")
        packaged = _run(
            "helm package",
            [str(helm), "package", str(chart_dir), "--destination", str(work)],
            env=env,
            timeout=120,
        )
        packages = sorted(work.glob("*.tgz"))
        if len(packages) != 1:
            raise RegistryError(f"helm package made {len(packages)} archives: {packaged.stdout}")
        package = packages[0]
        name = chart_dir.name
        version = package.name.removeprefix(f"{name}-").removesuffix(".tgz")
        pushed = _run(
            f"helm push of {package.name}",
            [
                str(helm), "push", str(package), chart_repository(endpoint),
                "--ca-file", str(paths.ca), "--registry-config", str(paths.auth_file),
            ],
            env=env, timeout=300,
        )  # fmt: skip
        digest = pushed_chart_digest(pushed.stdout + pushed.stderr)
    return PushedChart(f"{chart_repository(endpoint)}/{name}", version, digest)


# ---------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m localcluster.registry push|pull-secret --state DIR --address HOST:PORT`.

    The registry must have been prepared (`prepare`) and be serving.
    """
    parser = argparse.ArgumentParser(
        prog="python -m localcluster.registry", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--state", type=Path, required=True, help="the cluster's state directory")
    parser.add_argument("--address", required=True, help="HOST:PORT clients reach the registry at")
    commands = parser.add_subparsers(dest="command", required=True)
    push = commands.add_parser("push", help="push the built images and the chart")
    push.add_argument("images", nargs="*", help="local image names (default: every built one)")
    secret = commands.add_parser("pull-secret", help="print a dockerconfigjson Secret (JSON)")
    secret.add_argument("--name", required=True)
    secret.add_argument("--namespace", required=True)
    args = parser.parse_args(argv)
    host, _, port = str(args.address).rpartition(":")
    if not port.isdigit():
        parser.error(f"--address {args.address!r} is not HOST:PORT")
    try:
        endpoint = Endpoint(host.strip("[]"), int(port))
    except ValueError as err:
        parser.error(f"--address {args.address!r}: {err}")
    paths = paths_for(state_dir=args.state, cache=images.cache_dir(), cluster_name=args.state.name)
    try:
        if not paths.credentials.is_file():
            raise RegistryError(f"no registry prepared in {paths.state}")
        credentials = ensure_credentials(paths)
        if args.command == "pull-secret":
            print(
                json.dumps(pull_secret(args.name, args.namespace, endpoint, credentials), indent=2)
            )
            return 0
        wait_ready(endpoint, paths.ca, credentials, timeout_seconds=10)
        podman = images.podman_argv(images.cache_dir())
        names = args.images or built_images(podman, images.IMAGE_NAMES)
        for reference, digest in push_images(podman, names, endpoint, paths).items():
            print(f"registry: pushed {reference}@{digest}")
        chart = push_chart(endpoint, paths)
        print(f"registry: pushed {chart.reference}:{chart.version}@{chart.digest}")
    except RegistryError as err:
        print(f"registry: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
