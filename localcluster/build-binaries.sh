#!/usr/bin/env bash
# Builds the cluster's binaries from the Go modules pinned under
# localcluster/k8s into ${FUSEBOX_CACHE}/bin-<hash of the pins>, then points
# .cache/bin in the checkout at it. A second run with the same pins builds
# nothing; a changed pin builds a new directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cache=${FUSEBOX_CACHE:-$HOME/.cache/fusebox}
# The device plugin (gpusim) and the DRA driver (gpudra) are source written here,
# so their .go files count as pins, with those of the control-file reader both
# require (gpuctl, through a replace directive).
# The monitoring addon's section at the end has its own key, so it is left out.
pins=$(cd "$here" && sed '/^# --- Monitoring addon/,$d' build-binaries.sh | cat - k8s/go.mod k8s/go.sum k8s/*/go.mod k8s/*/go.sum \
  gpusim/go.mod gpusim/go.sum gpusim/*.go gpudra/go.mod gpudra/go.sum gpudra/*.go gpuctl/go.mod gpuctl/*.go netpol/go.mod netpol/go.sum | sha256sum | cut -c1-16)
out="$cache/bin-$pins"
mkdir -p "$root/.cache"
# shellcheck source=../scripts/lib/cache-lock.sh
. "$root/scripts/lib/cache-lock.sh"
cache_lock "$cache" binaries

if [ -f "$out/.complete" ]; then
  echo "binaries: up to date in $out"
else
  k8s_version=$(awk '/^require k8s.io\/kubernetes/ {print $3}' "$here/k8s/go.mod")
  minor=$(echo "$k8s_version" | cut -d. -f2)
  ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  tmp="$out.tmp"
  rm -rf "$tmp" && mkdir -p "$tmp"
  export CGO_ENABLED=0 GOFLAGS=-trimpath
  start=$SECONDS
  echo "binaries: building Kubernetes $k8s_version (about 10 minutes cold on 2 cores)"
  (cd "$here/k8s" && go build -ldflags "-s -w $ldflags" -o "$tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl)
  echo "binaries: building etcd, helm, coredns, kube-score"
  (cd "$here/k8s/etcd" && go build -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3)
  (cd "$here/k8s/helm" && go build -ldflags "-s -w" -o "$tmp/helm" helm.sh/helm/v4/cmd/helm)
  (cd "$here/k8s/coredns" && go build -ldflags "-s -w" -o "$tmp/coredns" github.com/coredns/coredns)
  (cd "$here/k8s/kube-score" && go build -ldflags "-s -w -X main.version=v1.20.0" -o "$tmp/kube-score" github.com/zegl/kube-score/cmd/kube-score)
  echo "binaries: building kube-router (NetworkPolicy)"
  (cd "$here/netpol" && go build -ldflags "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=v2.1.0" -o "$tmp/kube-router" github.com/cloudnativelabs/kube-router/v2/cmd/kube-router)
  echo "binaries: building the simulated-GPU device plugin (gpusim)"
  (cd "$here/gpusim" && go build -ldflags "-s -w" -o "$tmp/gpusim" .)
  echo "binaries: building the simulated-GPU DRA driver (gpudra)"
  (cd "$here/gpudra" && go build -ldflags "-s -w" -o "$tmp/gpudra" .)
  touch "$tmp/.complete"
  rm -rf "$out" && mv "$tmp" "$out"
  echo "binaries: built in $((SECONDS - start)) s into $out"
fi
ln -sfn "$out" "$root/.cache/bin"

# --- Monitoring addon (python -m localcluster monitoring) -------------------
# Prometheus (only Kubernetes discovery compiled in), the Prometheus Operator,
# its config reloader, and the operator's CRDs copied out of its module zip,
# built from the modules pinned under localcluster/monitoring into
# ${FUSEBOX_CACHE}/monitoring-<hash of those pins>, linked as .cache/monitoring.
# Its own key: a change here rebuilds only these three binaries.
monitoring_pins=$(cd "$here" && sed -n '/^# --- Monitoring addon/,/^# --- end of the monitoring addon/p' build-binaries.sh |
  cat - monitoring/*/go.mod monitoring/*/go.sum | sha256sum | cut -c1-16)
monitoring_out="$cache/monitoring-$monitoring_pins"
if [ -f "$monitoring_out/.complete" ]; then
  echo "monitoring binaries: up to date in $monitoring_out"
else
  tmp="$monitoring_out.tmp"
  rm -rf "$tmp" && mkdir -p "$tmp/crds"
  export CGO_ENABLED=0 GOFLAGS=-trimpath
  prometheus_version=$(cd "$here/monitoring/prometheus" && go list -m -f '{{.Version}}' github.com/prometheus/prometheus)
  operator_version=$(cd "$here/monitoring/operator" && go list -m -f '{{.Version}}' github.com/prometheus-operator/prometheus-operator)
  # Prometheus 3.MM.P is published as the Go module version v0.3MM.P.
  prometheus_release=$(echo "${prometheus_version#v}" | awk -F. '{printf "%d.%d.%s", substr($2, 1, 1), substr($2, 2), $3}')
  start=$SECONDS
  echo "monitoring binaries: building prometheus $prometheus_release (Kubernetes discovery only)"
  (cd "$here/monitoring/prometheus" && go build -tags remove_all_sd,enable_kubernetes_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$prometheus_release" \
    -o "$tmp/prometheus" github.com/prometheus/prometheus/cmd/prometheus)
  echo "monitoring binaries: prometheus built in $((SECONDS - start)) s"
  step=$SECONDS
  operator_ldflags="-s -w -X github.com/prometheus/common/version.Version=${operator_version#v}"
  (cd "$here/monitoring/operator" && go build -ldflags "$operator_ldflags" -o "$tmp/prometheus-operator" \
    github.com/prometheus-operator/prometheus-operator/cmd/operator)
  echo "monitoring binaries: prometheus-operator built in $((SECONDS - step)) s"
  step=$SECONDS
  (cd "$here/monitoring/operator" && go build -ldflags "$operator_ldflags" -o "$tmp/prometheus-config-reloader" \
    github.com/prometheus-operator/prometheus-operator/cmd/prometheus-config-reloader)
  echo "monitoring binaries: prometheus-config-reloader built in $((SECONDS - step)) s"
  operator_dir=$(cd "$here/monitoring/operator" && go list -m -f '{{.Dir}}' github.com/prometheus-operator/prometheus-operator)
  install -m 0644 "$operator_dir"/example/prometheus-operator-crd-full/*.yaml "$tmp/crds/"
  touch "$tmp/.complete"
  rm -rf "$monitoring_out" && mv "$tmp" "$monitoring_out"
  echo "monitoring binaries: built in $((SECONDS - start)) s into $monitoring_out"
fi
ln -sfn "$monitoring_out" "$root/.cache/monitoring"
# --- end of the monitoring addon -------------------------------------------

# --- versitygw (the S3 server of the s3:// model-source tests) -------------
# versitygw, built from the module pinned under localcluster/versitygw into
# ${FUSEBOX_CACHE}/versitygw-<hash of those pins>, linked as .cache/versitygw.
# The integration tests run it on 127.0.0.1 with its posix backend
# (docs/decisions/model-sources.md). Its own key: a new pin rebuilds only it.
versitygw_pins=$(cd "$here" && sed -n '/^# --- versitygw (the S3/,/^# --- end of versitygw/p' build-binaries.sh |
  cat - versitygw/go.mod versitygw/go.sum | sha256sum | cut -c1-16)
versitygw_out="$cache/versitygw-$versitygw_pins"
if [ -f "$versitygw_out/.complete" ]; then
  echo "versitygw: up to date in $versitygw_out"
else
  tmp="$versitygw_out.tmp"
  rm -rf "$tmp" && mkdir -p "$tmp"
  export CGO_ENABLED=0 GOFLAGS=-trimpath
  start=$SECONDS
  versitygw_version=$(cd "$here/versitygw" && go list -m -f '{{.Version}}' github.com/versity/versitygw)
  echo "versitygw: building $versitygw_version"
  (cd "$here/versitygw" && nice -n 19 go build -ldflags "-s -w -X main.Version=$versitygw_version" \
    -o "$tmp/versitygw" github.com/versity/versitygw/cmd/versitygw)
  touch "$tmp/.complete"
  rm -rf "$versitygw_out" && mv "$tmp" "$versitygw_out"
  echo "versitygw: built in $((SECONDS - start)) s into $versitygw_out"
fi
ln -sfn "$versitygw_out" "$root/.cache/versitygw"
# --- end of versitygw --------------------------------------------------------

# --- olah (the hub mirror of the hf:// model-source tests) -----------------
# The olah mirror serving local git repositories offline on 127.0.0.1, in its own
# virtual environment ${FUSEBOX_CACHE}/olah-<hash of its pins>, linked as .cache/olah:
# its psutil pin conflicts with requirements-dev.lock. Its own key, like the Go ones.
olah_pins=$(cd "$here" && sed -n '/^# --- olah (the hub/,/^# --- end of olah/p' build-binaries.sh |
  cat - olah/requirements.txt | sha256sum | cut -c1-16)
olah_out="$cache/olah-$olah_pins"
if [ -f "$olah_out/.complete" ]; then
  echo "olah: up to date in $olah_out"
else
  start=$SECONDS
  echo "olah: installing $(grep '^olah==' "$here/olah/requirements.txt") into its own environment"
  # Built in place (a venv's scripts name its directory); .complete marks it whole.
  rm -rf "$olah_out"
  "${PYTHON:-python3}" -m venv "$olah_out"
  nice -n 19 "$olah_out/bin/pip" install --quiet --no-deps -r "$here/olah/requirements.txt"
  touch "$olah_out/.complete"
  echo "olah: installed in $((SECONDS - start)) s into $olah_out"
fi
ln -sfn "$olah_out" "$root/.cache/olah"
# --- end of olah -------------------------------------------------------------

# --- registry (the authenticated OCI registry the cluster pulls from) --------
# The CNCF distribution registry v3 and a bcrypt htpasswd line maker (written
# here: distribution accepts only bcrypt, the dev Python has none), built from
# the module pinned under localcluster/registry into
# ${FUSEBOX_CACHE}/registry-<hash of those pins>, linked as .cache/registry
# (docs/decisions/registry.md). Its own key, like versitygw's. It sits before
# the containerd section because that section's key runs to the end of this
# file: appended after it, it would rebuild containerd.
registry_pins=$(cd "$here" && sed -n '/^# --- registry (the authenticated/,/^# --- end of the registry/p' build-binaries.sh |
  cat - registry/go.mod registry/go.sum registry/htpasswd/*.go | sha256sum | cut -c1-16)
registry_out="$cache/registry-$registry_pins"
if [ -f "$registry_out/.complete" ]; then
  echo "registry: up to date in $registry_out"
else
  tmp="$registry_out.tmp"
  rm -rf "$tmp" && mkdir -p "$tmp"
  export CGO_ENABLED=0 GOFLAGS=-trimpath
  start=$SECONDS
  registry_version=$(cd "$here/registry" && go list -m -f '{{.Version}}' github.com/distribution/distribution/v3)
  echo "registry: building distribution $registry_version and its htpasswd helper"
  (cd "$here/registry" && nice -n 19 go build \
    -ldflags "-s -w -X github.com/distribution/distribution/v3/version.version=$registry_version" \
    -o "$tmp/registry" github.com/distribution/distribution/v3/cmd/registry)
  (cd "$here/registry" && nice -n 19 go build -ldflags "-s -w" -o "$tmp/htpasswd" ./htpasswd)
  touch "$tmp/.complete"
  rm -rf "$registry_out" && mv "$tmp" "$registry_out"
  echo "registry: built in $((SECONDS - start)) s into $registry_out"
fi
ln -sfn "$registry_out" "$root/.cache/registry"
# --- end of the registry -----------------------------------------------------

# --- containerd (the node's container runtime) ------------------------------
# containerd 2 with CDI (Debian's 1.6 has none), its runc shim and ctr, built
# from the module pinned under localcluster/containerd-pins into
# ${FUSEBOX_CACHE}/containerd-<hash of those pins>, linked as .cache/containerd.
# Its own key: a new containerd rebuilds only these three binaries. runc and
# the CNI plugins stay Debian's.
containerd_pins=$(cd "$here" && sed -n '/^# --- containerd (the node/,$p' build-binaries.sh |
  cat - containerd-pins/go.mod containerd-pins/go.sum | sha256sum | cut -c1-16)
containerd_out="$cache/containerd-$containerd_pins"
if [ -f "$containerd_out/.complete" ]; then
  echo "containerd: up to date in $containerd_out"
else
  tmp="$containerd_out.tmp"
  rm -rf "$tmp" && mkdir -p "$tmp"
  export CGO_ENABLED=0 GOFLAGS=-trimpath
  containerd_version=$(cd "$here/containerd-pins" && go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)
  start=$SECONDS
  echo "containerd: building $containerd_version (containerd, containerd-shim-runc-v2, ctr)"
  # no_btrfs: the btrfs snapshotter needs cgo and the cluster uses overlayfs.
  (cd "$here/containerd-pins" && go build -tags no_btrfs \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version" -o "$tmp/" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr)
  touch "$tmp/.complete"
  rm -rf "$containerd_out" && mv "$tmp" "$containerd_out"
  echo "containerd: built in $((SECONDS - start)) s into $containerd_out"
fi
ln -sfn "$containerd_out" "$root/.cache/containerd"
# --- end of containerd ------------------------------------------------------
