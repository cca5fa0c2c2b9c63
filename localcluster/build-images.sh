#!/usr/bin/env bash
# Builds the project's images with podman, without Docker or a registry, and
# exports them into the OCI layout that localcluster loads into its
# containerd (localcluster/images.py). Idempotent and fast when nothing
# changed: the base is remade only when its recipe changes, the other images
# reuse podman's layer cache, and the export copies only new layers.
#
#   localhost/fusebox/base:bookworm   debootstrap (localcluster/images/base/)
#   localhost/fusebox/pause:latest    static C, the pod sandbox image
#   localhost/fusebox/coredns:latest  the CoreDNS binary from build-binaries.sh
#   localhost/fusebox/versitygw:latest the S3 server of the e2e tests (build-binaries.sh)
#   localhost/fusebox/olah:latest     the hub mirror of the e2e tests (localcluster/olah/ pins)
#   localhost/fusebox/<dir>:latest    every other localcluster/images/<dir>/Dockerfile
#   localhost/fusebox/operator:dev    operator/Dockerfile
#   localhost/fusebox/inference:dev   inference_image/Dockerfile
#
# When localcluster is running, the changed images are loaded into its
# containerd at the end (`python -m localcluster load-images`).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
export FUSEBOX_CACHE=${FUSEBOX_CACHE:-$HOME/.cache/fusebox}
cache=$FUSEBOX_CACHE
images_py="$here/images.py"
base=localhost/fusebox/base:bookworm

# The one podman invocation (storage under the cache), defined in images.py.
mapfile -t podman < <(python3 "$images_py" podman-argv)
mkdir -p "$cache/podman/tmp" "$cache/images"
# shellcheck source=../scripts/lib/cache-lock.sh
. "$root/scripts/lib/cache-lock.sh"
cache_lock "$cache" images

# Builds must reach PyPI through this machine's TLS-inspecting proxy: lend
# them the host's pip configuration and CA trust at build time only; nothing
# of it ends up in an image.
trust=()
for path in /etc/pip.conf /etc/ssl/certs; do
  [ -e "$path" ] && trust+=(--volume "$path:$path:ro")
done

failed=()
timed() { # timed LABEL COMMAND...: run, print how long it took; a failure is noted, not fatal
  local label=$1 start=$SECONDS
  shift
  if "$@"; then
    echo "images: $label ready in $((SECONDS - start)) s"
  else
    failed+=("$label")
  fi
}

build() { # build NAME CONTEXT [DOCKERFILE]: the full log goes to the cache, its tail on failure
  local name=$1 context=$2 dockerfile=${3:-$2/Dockerfile}
  local log="$cache/images/${name//[\/:]/_}.log"
  if ! "${podman[@]}" build --isolation chroot --network host --layers \
    --build-arg "BASE=$base" --build-context "contract=$root/contract" "${trust[@]}" \
    --file "$dockerfile" --tag "$name" "$context" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "images: building $name failed; full log: $log" >&2
    return 1
  fi
}

stage() { # stage DIR: a build context in the cache holding DIR's files
  local source=$1 context="$cache/images/$(basename "$1")"
  mkdir -p "$context"
  cp -p "$source"/* "$context"/
  echo "$context"
}

install_if_changed() { # install_if_changed SOURCE TARGET: keep TARGET's bytes unless they differ
  cmp -s "$1" "$2" || install -m 0755 "$1" "$2"
}

# 1. The base, remade only when its recipe changes.
recipe=$(cat "$here"/images/base/* | sha256sum | cut -c1-16)
stamp="$cache/podman/base.recipe"
if [ "$(cat "$stamp" 2>/dev/null)" = "$recipe" ] && "${podman[@]}" image exists "$base"; then
  echo "images: $base up to date"
else
  # Everything else builds on the base: without it, stop here.
  start=$SECONDS
  "$here/images/base/build.sh" "$base" "${podman[@]}"
  echo "$recipe" >"$stamp"
  echo "images: $base ready in $((SECONDS - start)) s"
fi

# 2. The pod sandbox: pause.c compiled statically into an otherwise empty image.
context=$(stage "$here/images/pause")
gcc -static -Os -s -Wall -Wextra -Werror -o "$context/pause.new" "$here/images/pause/pause.c"
install_if_changed "$context/pause.new" "$context/pause" && rm -f "$context/pause.new"
timed localhost/fusebox/pause:latest build localhost/fusebox/pause:latest "$context"

# 3. Images of one binary build-binaries.sh made: CoreDNS, and versitygw (the
# e2e tests' S3 server).
binary_image() { # binary_image DIR BINARY: localcluster/images/DIR with BINARY copied in
  local dir=$1 binary=$2 name="localhost/fusebox/$1:latest" context
  if [ ! -x "$binary" ]; then
    echo "images: skipping $name: $binary is missing (run \`make setup-binaries\`)" >&2
    return
  fi
  context=$(stage "$here/images/$dir")
  install_if_changed "$binary" "$context/$(basename "$binary")"
  timed "$name" build "$name" "$context"
}
binary_image coredns "$root/.cache/bin/coredns"
binary_image versitygw "$root/.cache/versitygw/versitygw"
# The hub mirror: its Dockerfile here, its pins (the build context) where the host's
# olah environment is built from, so the two never differ.
timed localhost/fusebox/olah:latest build localhost/fusebox/olah:latest "$here/olah" "$here/images/olah/Dockerfile"

# 4. Every other localcluster/images/<dir>/Dockerfile (e.g. the e2e test app).
for dockerfile in "$here"/images/*/Dockerfile; do
  dir=$(basename "$(dirname "$dockerfile")")
  # prometheus*: staged with their binaries by the monitoring section below.
  case $dir in base | pause | coredns | versitygw | olah | prometheus*) continue ;; esac
  timed "localhost/fusebox/$dir:latest" build "localhost/fusebox/$dir:latest" "$(dirname "$dockerfile")"
done

# 5. The project's two images.
timed localhost/fusebox/operator:dev build localhost/fusebox/operator:dev "$root/operator"
if [ -f "$root/inference_image/Dockerfile" ]; then
  timed localhost/fusebox/inference:dev build localhost/fusebox/inference:dev "$root/inference_image"
else
  echo "images: skipping localhost/fusebox/inference:dev: inference_image/Dockerfile does not exist yet" >&2
fi

# --- Monitoring addon (python -m localcluster monitoring) -------------------
# Prometheus, the Prometheus Operator and its config reloader, each an image
# of the binary build-binaries.sh made (.cache/monitoring) on the base.
for binary in prometheus prometheus-operator prometheus-config-reloader; do
  if [ -x "$root/.cache/monitoring/$binary" ]; then
    context=$(stage "$here/images/$binary")
    install_if_changed "$root/.cache/monitoring/$binary" "$context/$binary"
    timed "localhost/fusebox/$binary:latest" build "localhost/fusebox/$binary:latest" "$context"
  else
    echo "images: skipping localhost/fusebox/$binary:latest: .cache/monitoring/$binary is missing (run \`make setup-binaries\`)" >&2
  fi
done
# --- end of the monitoring addon -------------------------------------------

# Old versions of rebuilt images are now untagged; drop them (the layer
# cache of the current ones stays).
"${podman[@]}" image prune --force >/dev/null

# 6. Export what was built into the OCI layout localcluster loads from, even
# when one image failed, so the others still reach the cluster; load now if
# a cluster runs.
timed "OCI layout export" python3 "$images_py" export
if (cd "$root" && .venv/bin/python -m localcluster --help 2>/dev/null | grep -q load-images); then
  # A cluster that is not up says so; the images stay exported for `up`.
  (cd "$root" && .venv/bin/python -m localcluster load-images) ||
    echo "images: not loaded into a cluster (none running?); \`make cluster-up\` loads them"
else
  echo "images: \`python -m localcluster load-images\` does not exist yet; not loading"
fi

# 7. The operator's image and the chart into the cluster's authenticated registry,
# where a platform team's cluster pulls them from (docs/decisions/registry.md).
# The inference image is pushed by whoever pulls it (docs/day-one.md, by digest):
# its first push compresses 6 GB for minutes.
if (cd "$root" && .venv/bin/python -m localcluster --help 2>/dev/null | grep -q registry); then
  (cd "$root" && .venv/bin/python -m localcluster registry push localhost/fusebox/operator:dev) ||
    echo "images: not pushed to a registry (no cluster running one?); \`python -m localcluster registry push\` does"
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "images: FAILED: ${failed[*]} (the others are built and exported)" >&2
  exit 1
fi
