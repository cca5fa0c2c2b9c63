"""The cluster registry's pure parts: its config, the node's trust of it, the pull
Secret, the references pushed to, and what counts as ready."""

from __future__ import annotations

import base64
import json
import tomllib
from pathlib import Path

import pytest
import yaml

from localcluster import pki
from localcluster.registry import (
    Credentials,
    Endpoint,
    RegistryError,
    chart_repository,
    config_text,
    containerd_hosts,
    docker_config,
    htpasswd_line_is_bcrypt,
    image_reference,
    paths_for,
    pull_secret,
    push_image_argv,
    pushed_chart_digest,
    readiness_problem,
    serve_argv,
    serve_env,
    server_cert_spec,
)

PATHS = paths_for(
    state_dir=Path("/var/lib/fusebox-localcluster/fusebox"),
    cache=Path("/root/.cache/fusebox"),
    cluster_name="fusebox",
)
ENDPOINT = Endpoint("10.250.0.1", 5443)
CREDENTIALS = Credentials("fusebox", "s3cret:with-colon")


def test_layers_live_in_the_cache_and_secrets_in_the_cluster_state() -> None:
    assert PATHS.storage == Path("/root/.cache/fusebox/oci-registry/fusebox")
    assert PATHS.credentials.parent == Path("/var/lib/fusebox-localcluster/fusebox/registry")
    assert PATHS.ca == Path("/var/lib/fusebox-localcluster/fusebox/pki/ca.crt")
    assert PATHS.server_cert.parent == PATHS.ca.parent


def test_config_serves_tls_with_htpasswd_auth_over_filesystem_storage() -> None:
    config = yaml.safe_load(config_text(PATHS, ENDPOINT, http_secret="abc"))
    assert config["storage"]["filesystem"]["rootdirectory"] == str(PATHS.storage)
    assert config["auth"] == {
        "htpasswd": {"realm": "fusebox-localcluster", "path": str(PATHS.htpasswd)}
    }
    assert config["http"]["addr"] == "10.250.0.1:5443"
    assert config["http"]["secret"] == "abc"
    assert config["http"]["tls"]["certificate"] == str(PATHS.server_cert)
    assert config["http"]["tls"]["key"] == str(PATHS.server_key)
    assert config["storage"]["delete"] == {"enabled": False}


def test_config_quotes_paths_that_yaml_would_misread() -> None:
    odd = paths_for(state_dir=Path("/tmp/a: b #c"), cache=Path("/tmp/x"), cluster_name="n")
    config = yaml.safe_load(config_text(odd, ENDPOINT, http_secret="s"))
    assert config["auth"]["htpasswd"]["path"] == "/tmp/a: b #c/registry/htpasswd"


def test_registry_runs_its_config_with_tracing_off_and_no_env_overrides() -> None:
    assert serve_argv(PATHS, Path("/bin/registry")) == ["/bin/registry", "serve", str(PATHS.config)]
    env = serve_env({"PATH": "/usr/bin", "REGISTRY_HTTP_ADDR": ":80"})
    assert env == {"PATH": "/usr/bin", "OTEL_TRACES_EXPORTER": "none"}


def test_server_certificate_names_ips_and_dns_names_apart() -> None:
    spec = server_cert_spec(ENDPOINT, extra_names=("localhost", "127.0.0.1", "10.250.0.1"))
    assert spec.ip_addresses == ("10.250.0.1", "127.0.0.1")
    assert spec.dns_names == ("localhost",)
    assert spec.server and not spec.client
    assert "IP:10.250.0.1" in pki.extensions_text(spec)


def test_endpoint_refuses_a_bad_port_or_host() -> None:
    with pytest.raises(ValueError, match="port 0"):
        Endpoint("127.0.0.1", 0)
    with pytest.raises(ValueError, match="not a host name"):
        Endpoint("https://x", 5000)
    with pytest.raises(ValueError, match="not a host name"):
        Endpoint("host:5000", 5000)


def test_ipv6_endpoints_are_bracketed() -> None:
    assert Endpoint("::1", 5000).address == "[::1]:5000"
    assert Endpoint("::1", 5000).url == "https://[::1]:5000"


def test_password_never_appears_in_repr() -> None:
    assert "s3cret" not in repr(CREDENTIALS)


def test_pull_secret_decodes_to_the_registry_auth() -> None:
    secret = pull_secret("regcred", "fusebox-system", ENDPOINT, CREDENTIALS)
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    assert secret["metadata"] == {"name": "regcred", "namespace": "fusebox-system"}
    decoded = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    entry = decoded["auths"]["10.250.0.1:5443"]
    assert base64.b64decode(entry["auth"]).decode() == "fusebox:s3cret:with-colon"
    assert (entry["username"], entry["password"]) == ("fusebox", "s3cret:with-colon")


def test_auth_file_and_secret_carry_the_same_docker_config() -> None:
    secret = pull_secret("regcred", "ns", ENDPOINT, CREDENTIALS)
    decoded = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    assert decoded == docker_config(ENDPOINT, CREDENTIALS)


def test_containerd_trusts_the_ca_at_the_hosts_path_without_credentials() -> None:
    hosts = containerd_hosts(Path("/state/containerd/certs.d"), ENDPOINT, PATHS.ca)
    assert hosts.path == Path("/state/containerd/certs.d/10.250.0.1:5443/hosts.toml")
    parsed = tomllib.loads(hosts.text)
    assert parsed["server"] == "https://10.250.0.1:5443"
    assert parsed["host"]["https://10.250.0.1:5443"] == {
        "capabilities": ["pull", "resolve"],
        "ca": str(PATHS.ca),
    }
    assert "password" not in hosts.text and "auth" not in hosts.text


def test_local_images_map_into_the_registry() -> None:
    assert (
        image_reference("localhost/fusebox/operator:dev", ENDPOINT)
        == "10.250.0.1:5443/fusebox/operator:dev"
    )
    assert chart_repository(ENDPOINT) == "oci://10.250.0.1:5443/charts"


@pytest.mark.parametrize("name", ["docker.io/library/busybox:1", "localhost/fusebox/operator"])
def test_only_tagged_local_images_are_pushed(name: str) -> None:
    with pytest.raises(ValueError, match="not a local image"):
        image_reference(name, ENDPOINT)


def test_push_reads_credentials_from_the_auth_file_never_the_argv() -> None:
    argv = push_image_argv(
        ["podman"], "localhost/fusebox/pause:latest", ENDPOINT, PATHS, Path("/tmp/d")
    )
    assert "s3cret" not in " ".join(argv) and "--creds" not in argv
    assert argv[argv.index("--authfile") + 1] == str(PATHS.auth_file)
    assert argv[argv.index("--cert-dir") + 1] == str(PATHS.cert_dir)
    assert argv[-1] == "docker://10.250.0.1:5443/fusebox/pause:latest"


@pytest.mark.parametrize(
    ("anonymous", "authenticated", "problem"),
    [
        (401, 200, None),
        (200, 200, "without credentials answered 200, not 401"),
        (401, 401, "with the cluster's credentials answered 401, not 200"),
        (503, 503, "without credentials answered 503"),
    ],
)
def test_ready_means_anonymous_refused_and_cluster_user_admitted(
    anonymous: int, authenticated: int, problem: str | None
) -> None:
    verdict = readiness_problem(anonymous, authenticated)
    if problem is None:
        assert verdict is None
    else:
        assert verdict is not None and problem in verdict


def test_helm_push_digest_is_read_from_its_output() -> None:
    digest = "sha256:" + "a" * 64
    output = f"Pushed: 127.0.0.1:5000/charts/fusebox:0.1.0\nDigest: {digest}\n"
    assert pushed_chart_digest(output) == digest
    with pytest.raises(RegistryError, match="no digest"):
        pushed_chart_digest("Error: unauthorized")


def test_only_bcrypt_htpasswd_lines_for_the_user_pass() -> None:
    line = "fusebox:$2a$04$1JL3uTF3b0lkQEuzYjs9FuVVGl/C6n3A0c1B26wK4x7CQnZHdAtVK\n"
    assert htpasswd_line_is_bcrypt(line, "fusebox")
    assert not htpasswd_line_is_bcrypt(line, "someone")
    assert not htpasswd_line_is_bcrypt("fusebox:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=", "fusebox")
