#!/usr/bin/env bash
# Builds kwok (the fake-node controller) from the module pinned under
# localcluster/kwok into ${FUSEBOX_CACHE}/kwok-<hash of the pins>, links it as
# .cache/kwok and prints the binary's path. Called by bench/operator_scale_bench.py
# the first time it runs, never by `make setup` or `make test`: only the fleet
# simulation needs kwok, so CI's test run never pays for the build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cache=${FUSEBOX_CACHE:-$HOME/.cache/fusebox}
pins=$(cd "$here" && cat build-kwok.sh kwok/go.mod kwok/go.sum | sha256sum | cut -c1-16)
out="$cache/kwok-$pins"
mkdir -p "$root/.cache"
# shellcheck source=../scripts/lib/cache-lock.sh
. "$root/scripts/lib/cache-lock.sh"
cache_lock "$cache" kwok

if [ -f "$out/.complete" ]; then
  echo "kwok: up to date in $out" >&2
else
  tmp="$out.tmp"
  rm -rf "$tmp" && mkdir -p "$tmp"
  export CGO_ENABLED=0 GOFLAGS=-trimpath
  version=$(cd "$here/kwok" && go list -m -f '{{.Version}}' sigs.k8s.io/kwok)
  start=$SECONDS
  echo "kwok: building $version (a few minutes cold on 2 cores)" >&2
  (cd "$here/kwok" && nice -n 19 go build -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$version" \
    -o "$tmp/kwok" sigs.k8s.io/kwok/cmd/kwok) >&2
  touch "$tmp/.complete"
  rm -rf "$out" && mv "$tmp" "$out"
  echo "kwok: built in $((SECONDS - start)) s into $out" >&2
fi
ln -sfn "$out" "$root/.cache/kwok"
echo "$out/kwok"
