#!/usr/bin/env bash
# Makes the project's Debian base image without a registry or Docker:
# debootstrap a minimal bookworm (python3, venv, pip, CA certificates), strip
# what a container never reads (apt lists and caches, docs, logs), and import
# the tree with `podman import`. Every project image builds FROM it through
# `--build-arg BASE=...`, so the Dockerfiles stay standard (their default
# base is python:3.11-slim-bookworm) while nothing is pulled from a registry.
#
# Usage: build.sh IMAGE_NAME PODMAN_ARGV...
#   The podman command (with its storage flags) is passed in by
#   build-images.sh so the storage is configured in one place.
# The Debian mirror is the machine's own (its apt sources), or
# $FUSEBOX_DEBIAN_MIRROR.
set -euo pipefail
name=$1
shift
podman=("$@")
cache=${FUSEBOX_CACHE:-$HOME/.cache/fusebox}
packages=python3,python3-venv,python3-pip,ca-certificates

debian_mirror() {
  if [ -n "${FUSEBOX_DEBIAN_MIRROR:-}" ]; then
    echo "$FUSEBOX_DEBIAN_MIRROR"
    return
  fi
  local uri
  # deb822 sources first (Debian 12 default), then the one-line format.
  uri=$(awk '/^URIs:/ {for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) {print $i; exit}}' \
    /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 || true)
  if [ -z "$uri" ]; then
    uri=$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

mkdir -p "$cache/tmp"
work=$(mktemp -d "$cache/tmp/base.XXXXXX")
cleanup() {
  # debootstrap mounts proc/sys inside the target while it runs; a failed run
  # can leave them mounted, so unmount before deleting, and never cross into
  # another file system while deleting.
  local mounts
  mounts=$(findmnt -rn -o TARGET | grep -F "$work/" | sort -r || true)
  for m in $mounts; do umount -l "$m" || true; done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT

mirror=$(debian_mirror)
root="$work/root"
echo "base: debootstrap bookworm from $mirror (about 1 minute)"
debootstrap --variant=minbase --include="$packages" bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log" >&2
  echo "base: debootstrap failed (log above)" >&2
  exit 1
}

# What a container never needs: package indexes and caches, docs, man pages,
# translations, logs written by the install. The standard library's bytecode
# stays: a read-only root filesystem could never cache it at run time.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
  "$root"/var/lib/dpkg/*-old "$root"/var/log/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
  "$root"/usr/share/locale/* "$root"/tmp/* "$root"/var/tmp/*
find "$root/usr/share/doc" -mindepth 2 ! -name copyright -delete 2>/dev/null || true

tar -C "$root" --numeric-owner --xattrs \
  --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' --exclude='./run/*' -c . |
  "${podman[@]}" import --quiet \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/usr/bin/python3"]' \
    - "$name" >/dev/null
echo "base: imported $name"
