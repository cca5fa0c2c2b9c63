"""The cluster's certificates and keys, made with the openssl CLI.

The venv may not exist yet when the cluster is first started and the
`cryptography` package is not guaranteed, while openssl 3 is on every Debian
machine; so this shells out. Keys are ECDSA P-256 (fast to generate, accepted
by every component). One CA signs everything: it is a throwaway cluster, and
a single trust root keeps the kubelet's client-certificate authentication and
the apiserver's verification of the kubelet the same file.
"""

from __future__ import annotations

import base64
import dataclasses
import secrets
import subprocess
from collections.abc import Sequence
from pathlib import Path

CA_NAME = "ca"


@dataclasses.dataclass(frozen=True)
class CertSpec:
    """One leaf certificate: who it names and what it may be used for."""

    name: str  # file stem: <name>.crt / <name>.key
    common_name: str
    organizations: tuple[str, ...] = ()
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()
    server: bool = False
    client: bool = False


def _openssl(args: Sequence[str]) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {result.stderr.strip()}")


def _new_key(path: Path) -> None:
    _openssl(
        ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path)]
    )
    path.chmod(0o600)


def _subject(common_name: str, organizations: Sequence[str]) -> str:
    return "".join(f"/O={org}" for org in organizations) + f"/CN={common_name}"


def extensions_text(spec: CertSpec) -> str:
    """The X.509 v3 extensions of a leaf, in openssl extfile syntax. Pure."""
    usages = [
        u for u, wanted in (("serverAuth", spec.server), ("clientAuth", spec.client)) if wanted
    ]
    lines = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={','.join(usages)}",
    ]
    alt = [f"DNS:{d}" for d in spec.dns_names] + [f"IP:{ip}" for ip in spec.ip_addresses]
    if alt:
        lines.append(f"subjectAltName={','.join(alt)}")
    return "\n".join(lines) + "\n"


def make_ca(pki_dir: Path) -> None:
    pki_dir.mkdir(parents=True, exist_ok=True)
    key = pki_dir / f"{CA_NAME}.key"
    config = pki_dir / "ca.cnf"
    config.write_text(
        "[req]\ndistinguished_name=dn\nx509_extensions=v3_ca\nprompt=no\n[dn]\n"
        "CN=fusebox-localcluster-ca\n[v3_ca]\nbasicConstraints=critical,CA:TRUE\n"
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature\n"
        "subjectKeyIdentifier=hash\n"
    )
    _new_key(key)
    _openssl(
        [
            "req",
            "-x509",
            "-new",
            "-key",
            str(key),
            "-config",
            str(config),
            "-days",
            "3650",
            "-out",
            str(pki_dir / f"{CA_NAME}.crt"),
        ]
    )


def issue(pki_dir: Path, spec: CertSpec) -> None:
    key = pki_dir / f"{spec.name}.key"
    csr = pki_dir / f"{spec.name}.csr"
    ext = pki_dir / f"{spec.name}.ext"
    _new_key(key)
    _openssl(
        [
            "req",
            "-new",
            "-key",
            str(key),
            "-subj",
            _subject(spec.common_name, spec.organizations),
            "-out",
            str(csr),
        ]
    )
    ext.write_text(extensions_text(spec))
    _openssl(
        [
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(pki_dir / f"{CA_NAME}.crt"),
            "-CAkey",
            str(pki_dir / f"{CA_NAME}.key"),
            "-set_serial",
            f"0x{secrets.token_hex(16)}",
            "-days",
            "825",
            "-extfile",
            str(ext),
            "-out",
            str(pki_dir / f"{spec.name}.crt"),
        ]
    )
    csr.unlink()
    ext.unlink()


def make_service_account_keys(pki_dir: Path) -> None:
    """The key pair that signs and verifies ServiceAccount tokens."""
    _new_key(pki_dir / "sa.key")
    _openssl(["pkey", "-in", str(pki_dir / "sa.key"), "-pubout", "-out", str(pki_dir / "sa.pub")])


def cluster_cert_specs(
    *, node_name: str, node_ip: str, apiserver_service_ip: str
) -> list[CertSpec]:
    """Every leaf the cluster needs, with the names each peer will verify. Pure."""
    return [
        CertSpec(
            "apiserver",
            "kube-apiserver",
            dns_names=(
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
                "localhost",
            ),
            ip_addresses=(node_ip, apiserver_service_ip, "127.0.0.1"),
            server=True,
        ),
        CertSpec(
            "etcd-server",
            "etcd",
            dns_names=("localhost",),
            ip_addresses=("127.0.0.1",),
            server=True,
            client=True,
        ),
        CertSpec("apiserver-etcd-client", "kube-apiserver-etcd-client", client=True),
        CertSpec(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            organizations=("system:masters",),
            client=True,
        ),
        CertSpec("admin", "fusebox-admin", organizations=("system:masters",), client=True),
        CertSpec("controller-manager", "system:kube-controller-manager", client=True),
        CertSpec("scheduler", "system:kube-scheduler", client=True),
        CertSpec("kube-proxy", "system:kube-proxy", client=True),
        CertSpec(
            "kubelet-client",
            f"system:node:{node_name}",
            organizations=("system:nodes",),
            client=True,
        ),
        CertSpec(
            "kubelet-server",
            node_name,
            dns_names=(node_name,),
            ip_addresses=(node_ip,),
            server=True,
        ),
    ]


def make_cluster_pki(pki_dir: Path, specs: Sequence[CertSpec]) -> None:
    make_ca(pki_dir)
    for spec in specs:
        issue(pki_dir, spec)
    make_service_account_keys(pki_dir)


def kubeconfig_text(
    *, server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, user: str
) -> str:
    """A single-context kubeconfig with the credentials embedded (portable). Pure."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return (
        "apiVersion: v1\nkind: Config\n"
        "clusters:\n- name: fusebox\n  cluster:\n"
        f"    server: {server}\n    certificate-authority-data: {b64(ca_pem)}\n"
        f"users:\n- name: {user}\n  user:\n"
        f"    client-certificate-data: {b64(cert_pem)}\n    client-key-data: {b64(key_pem)}\n"
        f"contexts:\n- name: fusebox\n  context:\n    cluster: fusebox\n    user: {user}\n"
        "current-context: fusebox\n"
    )


def write_kubeconfig(path: Path, *, pki_dir: Path, cert_name: str, server: str) -> None:
    path.write_text(
        kubeconfig_text(
            server=server,
            ca_pem=(pki_dir / f"{CA_NAME}.crt").read_bytes(),
            cert_pem=(pki_dir / f"{cert_name}.crt").read_bytes(),
            key_pem=(pki_dir / f"{cert_name}.key").read_bytes(),
            user=cert_name,
        )
    )
    path.chmod(0o600)
