#!/usr/bin/env bash
# Builds the cluster's binaries from the Go modules pinned under
# localcluster/k8s into ${FUSEBOX_CACHE}/bin-<hash of the pins>, then points
# .cache/bin in the checkout at it. A second run with the same pins builds
# nothing; a changed pin builds a new directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cache=${FUSEBOX_CACHE:-$HOME/.cache/fusebox}
# The device plugin (gpusim) is source written here, so its .go files count as pins.
pins=$(cd "$here" && cat build-binaries.sh k8s/go.mod k8s/go.sum k8s/*/go.mod k8s/*/go.sum \
  gpusim/go.mod gpusim/go.sum gpusim/*.go netpol/go.mod netpol/go.sum | sha256sum | cut -c1-16)
out="$cache/bin-$pins"
mkdir -p "$root/.cache"

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
  touch "$tmp/.complete"
  rm -rf "$out" && mv "$tmp" "$out"
  echo "binaries: built in $((SECONDS - start)) s into $out"
fi
ln -sfn "$out" "$root/.cache/bin"
