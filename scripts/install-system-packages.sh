#!/usr/bin/env bash
# Installs the Debian packages localcluster and the tests need, and nothing
# when they are all present (so `make setup` stays fast on a warm machine).
set -euo pipefail
packages=(
  runc containernetworking-plugins              # the OCI runtime and CNI plugins (containerd is built: localcluster/containerd-pins)
  podman fuse-overlayfs uidmap debootstrap      # images built here, without Docker
  iptables conntrack iproute2 socat             # kube-proxy, port-forward, the node's netns
  ipset                                         # kube-router's NetworkPolicy sets
  prometheus                                    # promtool, to check the sidecar's metrics
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "system packages: all present"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "system packages missing: ${missing[*]}; run: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "system packages: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts the packaged services; localcluster runs its own instances
# (containerd too, where an older setup installed Debian's).
systemctl disable --now containerd prometheus prometheus-node-exporter >/dev/null 2>&1 || true
