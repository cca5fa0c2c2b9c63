"""The project's images, from podman's storage to the node's containerd.

There is no registry: `build-images.sh` builds with podman and then exports
every image into one OCI image layout under the cache (`export`). Both sides
skip what they already hold, which is what keeps a code-only change fast:

- podman writes into the layout only the blobs it lacks, because layers are
  exported uncompressed and so their digests are known before any copying;
- `load_images` compares each image's manifest digest in the layout with the
  one containerd has under the same name, and for a changed image streams to
  `ctr images import` only the blobs containerd's content store lacks. The
  importer resolves the rest from the content store, so a new code layer on
  top of a 6 GB torch layer moves kilobytes, not gigabytes.

The podman invocation (its storage under `${FUSEBOX_CACHE}/podman`) is
defined here once; build-images.sh reads it with `images.py podman-argv`.
This module uses only the standard library so the build script can run it
with the system Python before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parent.parent
IMAGES_DIR = Path(__file__).resolve().parent / "images"

BASE_IMAGE = "localhost/fusebox/base:bookworm"
PAUSE_IMAGE = "localhost/fusebox/pause:latest"
COREDNS_IMAGE = "localhost/fusebox/coredns:latest"
OPERATOR_IMAGE = "localhost/fusebox/operator:dev"
INFERENCE_IMAGE = "localhost/fusebox/inference:dev"
CONTAINERD_NAMESPACE = "k8s.io"

# Image folders under localcluster/images that are not plain Dockerfile builds
# of `localhost/fusebox/<folder>:latest`.
_SPECIAL_FOLDERS = frozenset({"base"})

_REF_NAME = "org.opencontainers.image.ref.name"
_OCI_LAYOUT = '{"imageLayoutVersion": "1.0.0"}'


def discover_image_names(images_dir: Path = IMAGES_DIR) -> tuple[str, ...]:
    """Names of every image pods run, in build order.

    The base is left out: pods never run it, and its layer travels inside
    every image built on it.
    """
    folders = sorted(
        p.name
        for p in images_dir.iterdir()
        if p.is_dir() and (p / "Dockerfile").is_file() and p.name not in _SPECIAL_FOLDERS
    )
    names = [f"localhost/fusebox/{folder}:latest" for folder in folders]
    return (*names, OPERATOR_IMAGE, INFERENCE_IMAGE)


IMAGE_NAMES: tuple[str, ...] = discover_image_names() if IMAGES_DIR.is_dir() else ()


def cache_dir() -> Path:
    """`${FUSEBOX_CACHE:-~/.cache/fusebox}`, where every generated thing lives."""
    configured = os.environ.get("FUSEBOX_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "fusebox"


def layout_dir(cache: Path) -> Path:
    """The OCI image layout that `export` fills and `load_images` reads."""
    return cache / "oci-layout"


def podman_argv(cache: Path) -> list[str]:
    """The podman command with the project's own storage.

    Explicit flags instead of the machine's configuration: podman's defaults
    here (crun, systemd cgroups, /var/lib/containers) either fail on this
    kernel or would share state with anything else using podman.
    """
    store = cache / "podman"
    return [
        "podman",
        "--root",
        str(store / "root"),
        "--runroot",
        str(store / "run"),
        "--tmpdir",
        str(store / "tmp"),
        "--storage-driver",
        "overlay",
        "--cgroup-manager",
        "cgroupfs",
        "--events-backend",
        "file",
        "--runtime",
        "runc",
    ]


# ---------------------------------------------------------------- pure logic


@dataclass(frozen=True)
class Descriptor:
    """An OCI content descriptor: what a blob is and how large."""

    media_type: str
    digest: str
    size_bytes: int

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Descriptor:
        return cls(str(raw["mediaType"]), str(raw["digest"]), int(raw["size"]))


def manifests_by_name(index: Mapping[str, Any]) -> dict[str, Descriptor]:
    """Image name → manifest descriptor, from an OCI layout's index.json."""
    found: dict[str, Descriptor] = {}
    for entry in index.get("manifests", []):
        name = entry.get("annotations", {}).get(_REF_NAME)
        if name:
            found[str(name)] = Descriptor.from_json(entry)
    return found


def blobs_of_manifest(manifest: Mapping[str, Any]) -> list[Descriptor]:
    """The config and layer blobs a single-platform image manifest needs."""
    return [
        Descriptor.from_json(manifest["config"]),
        *(Descriptor.from_json(layer) for layer in manifest["layers"]),
    ]


def parse_ctr_images(listing: str) -> dict[str, str]:
    """Image name → manifest digest, from `ctr images ls` output.

    Columns: REF TYPE DIGEST SIZE PLATFORMS LABELS; the size has a space
    ("126.4 MiB") so only the first three columns are read by position.
    """
    images: dict[str, str] = {}
    for line in listing.splitlines()[1:]:
        columns = line.split()
        if len(columns) >= 3 and columns[2].startswith("sha256:"):
            images[columns[0]] = columns[2]
    return images


def stale_images(
    wanted: Iterable[str], in_layout: Mapping[str, Descriptor], in_containerd: Mapping[str, str]
) -> list[str]:
    """The wanted images whose layout manifest differs from containerd's."""
    return [
        name
        for name in wanted
        if name in in_layout and in_containerd.get(name) != in_layout[name].digest
    ]


def superseded_image_ids(in_containerd: Mapping[str, str]) -> list[str]:
    """The `sha256:<image id>` references no named image points at any more. Pure.

    The kubelet's CRI names every image it runs by its id as well. When a
    rebuilt image takes over a name, the old id's reference stays and keeps the
    old image's content and unpacked layers (6 GB for an inference image) on
    disk for good: nothing here garbage-collects images (they could not be
    pulled again). Dropping those references lets containerd free them.
    """
    named = {digest for name, digest in in_containerd.items() if not name.startswith("sha256:")}
    return sorted(
        name
        for name, digest in in_containerd.items()
        if name.startswith("sha256:") and digest not in named
    )


def import_index(names: Sequence[str], in_layout: Mapping[str, Descriptor]) -> dict[str, Any]:
    """An index.json naming exactly the images to import."""
    return {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": in_layout[name].media_type,
                "digest": in_layout[name].digest,
                "size": in_layout[name].size_bytes,
                "annotations": {_REF_NAME: name},
            }
            for name in names
        ],
    }


def unreferenced_blobs(present: Iterable[str], referenced: Iterable[str]) -> list[str]:
    """Blob digests in the layout that no indexed image uses any more."""
    keep = set(referenced)
    return sorted(d for d in present if d not in keep)


# ---------------------------------------------------------------- I/O edges


class ImageError(RuntimeError):
    """A build or load step failed; the message says what to run."""


def _run(argv: Sequence[str], *, input_bytes: bytes | None = None) -> str:
    try:
        done = subprocess.run(argv, input=input_bytes, capture_output=True, check=False)
    except FileNotFoundError as exc:
        raise ImageError(f"{argv[0]} is not installed (run `make setup-system`)") from exc
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip()
        raise ImageError(f"`{' '.join(argv[:6])} ...` failed: {detail}")
    return done.stdout.decode(errors="replace")


def _blob_path(layout: Path, digest: str) -> Path:
    algorithm, _, hex_digest = digest.partition(":")
    return layout / "blobs" / algorithm / hex_digest


def _read_json(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


@contextmanager
def _locked(layout: Path) -> Iterator[None]:
    """One writer or reader of the layout at a time (build vs cluster up)."""
    layout.parent.mkdir(parents=True, exist_ok=True)
    with open(layout.parent / "oci-layout.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def export_images(cache: Path, names: Sequence[str] = IMAGE_NAMES) -> list[str]:
    """Copy the built images from podman into the layout; return those missing.

    Blobs the layout already has are not rewritten, so re-exporting an image
    whose big layers did not change takes a fraction of a second. Blobs that
    no image uses any more are deleted afterwards.
    """
    podman = podman_argv(cache)
    layout = layout_dir(cache)
    missing: list[str] = []
    with _locked(layout):
        layout.mkdir(parents=True, exist_ok=True)
        for name in names:
            exists = subprocess.run([*podman, "image", "exists", name], check=False)
            if exists.returncode != 0:
                missing.append(name)
                continue
            _run(
                [
                    *podman,
                    "save",
                    "--quiet",
                    "--format",
                    "oci-dir",
                    "--uncompressed",
                    "--output",
                    str(layout),
                    name,
                ]
            )
        _prune_layout(layout)
    return missing


def _prune_layout(layout: Path) -> None:
    """Drop what no named image uses: podman leaves a replaced image's
    manifest in index.json without its name, and its blobs behind."""
    index_path = layout / "index.json"
    if not index_path.is_file():
        return
    named = manifests_by_name(_read_json(index_path))
    rewritten = layout / "index.json.new"
    rewritten.write_text(json.dumps(import_index(sorted(named), named)))
    rewritten.replace(index_path)
    referenced: set[str] = set()
    for descriptor in named.values():
        referenced.add(descriptor.digest)
        manifest = _read_json(_blob_path(layout, descriptor.digest))
        referenced.update(blob.digest for blob in blobs_of_manifest(manifest))
    blob_root = layout / "blobs"
    present = {
        f"{algorithm.name}:{blob.name}"
        for algorithm in blob_root.iterdir()
        if algorithm.is_dir()
        for blob in algorithm.iterdir()
    }
    for digest in unreferenced_blobs(present, referenced):
        _blob_path(layout, digest).unlink()


def _stream_import(
    layout: Path,
    names: Sequence[str],
    in_layout: Mapping[str, Descriptor],
    digests: Sequence[str],
    sink: IO[bytes],
) -> None:
    """Write an OCI archive with the given images' index and only `digests`."""
    with tarfile.open(fileobj=sink, mode="w|", bufsize=1 << 20) as archive:
        for arcname, payload in (
            ("oci-layout", _OCI_LAYOUT.encode()),
            ("index.json", json.dumps(import_index(names, in_layout)).encode()),
        ):
            info = tarfile.TarInfo(arcname)
            info.size = len(payload)
            archive.addfile(info, _BytesReader(payload))
        for digest in digests:
            path = _blob_path(layout, digest)
            archive.add(str(path), arcname=str(path.relative_to(layout)), recursive=False)


class _BytesReader:
    """The minimal file object tarfile.addfile reads a payload from."""

    def __init__(self, payload: bytes) -> None:
        self._payload = payload
        self._offset = 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._payload) if size < 0 else self._offset + size
        chunk = self._payload[self._offset : end]
        self._offset += len(chunk)
        return chunk


def load_images(
    ctr_binary: str,
    containerd_address: str,
    names: Sequence[str] | None = None,
    *,
    discard_unpacked_layers: bool = False,
) -> None:
    """Make containerd hold every built image under the name pods use.

    Reads the layout `build-images.sh` exported (run `make images` first),
    compares each image's manifest digest with what containerd's `k8s.io`
    namespace holds under the same name, and imports only changed images,
    sending only the blobs containerd lacks. Images never built (for example
    the inference image before its Dockerfile exists) are reported on stderr
    and skipped; `missing_images` lists them for a caller that must fail.
    `names` restricts the load to those images (default: IMAGE_NAMES).
    `discard_unpacked_layers`: containerd drops each layer's blob once it is
    unpacked (the node keeps the snapshot only, half the disk); the next
    load of a rebuilt image then sends every layer, not only the new ones.

    Raises ImageError when the layout is absent or ctr fails.
    """
    layout = layout_dir(cache_dir())
    index_path = layout / "index.json"
    if not index_path.is_file():
        raise ImageError(f"no images exported in {layout}: run `make images`")
    ctr = [ctr_binary, "--address", containerd_address, "--namespace", CONTAINERD_NAMESPACE]
    with _locked(layout):
        in_layout = manifests_by_name(_read_json(index_path))
        wanted = IMAGE_NAMES if names is None else tuple(names)
        for name in wanted:
            if name not in in_layout:
                print(f"images: {name} is not built; run `make images`", file=sys.stderr)
        in_containerd = parse_ctr_images(_run([*ctr, "images", "ls"]))
        stale = stale_images(wanted, in_layout, in_containerd)
        if not stale:
            print("images: containerd is up to date", file=sys.stderr)
            return
        known = set(_run([*ctr, "content", "ls", "--quiet"]).split())
        needed: list[str] = []
        for name in stale:
            manifest_digest = in_layout[name].digest
            manifest = _read_json(_blob_path(layout, manifest_digest))
            for digest in [manifest_digest, *(b.digest for b in blobs_of_manifest(manifest))]:
                if digest not in known and digest not in needed:
                    needed.append(digest)
        print(f"images: importing {', '.join(stale)} ({len(needed)} new blobs)", file=sys.stderr)
        _import(ctr, layout, stale, in_layout, needed, discard_unpacked_layers)
        superseded = superseded_image_ids(parse_ctr_images(_run([*ctr, "images", "ls"])))
        if superseded:
            print(f"images: dropping {len(superseded)} superseded image ids", file=sys.stderr)
            _run([*ctr, "images", "rm", *superseded])


def _import(
    ctr: Sequence[str],
    layout: Path,
    names: Sequence[str],
    in_layout: Mapping[str, Descriptor],
    digests: Sequence[str],
    discard_unpacked_layers: bool = False,
) -> None:
    # ctr discards unpacked layers only in its local import, not through the transfer API.
    discard = ["--local", "--discard-unpacked-layers"] if discard_unpacked_layers else []
    argv = [*ctr, "images", "import", "--all-platforms", *discard, "-"]
    with subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    ) as proc:
        assert proc.stdin is not None and proc.stderr is not None
        try:
            _stream_import(layout, names, in_layout, digests, proc.stdin)
        except BrokenPipeError:
            pass  # ctr stopped reading; its exit status and stderr say why
        finally:
            proc.stdin.close()
        detail = proc.stderr.read().decode(errors="replace").strip()
        if proc.wait() != 0:
            raise ImageError(f"ctr images import failed: {detail}")


def missing_images(ctr_binary: str, containerd_address: str) -> list[str]:
    """The images pods need that containerd does not hold (to report at `up`)."""
    ctr = [ctr_binary, "--address", containerd_address, "--namespace", CONTAINERD_NAMESPACE]
    present = parse_ctr_images(_run([*ctr, "images", "ls"]))
    return [name for name in IMAGE_NAMES if name not in present]


def main(argv: Sequence[str] | None = None) -> int:
    """`images.py podman-argv | export | load --ctr CTR --address SOCKET`."""
    parser = argparse.ArgumentParser(prog="images.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("podman-argv", help="print the podman command, one word a line")
    commands.add_parser("names", help="print the images pods run, one a line")
    commands.add_parser("export", help="copy the built images into the OCI layout")
    load = commands.add_parser("load", help="import changed images into a containerd")
    load.add_argument("--ctr", default="ctr")
    load.add_argument("--address", required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "podman-argv":
            print("\n".join(podman_argv(cache_dir())))
        elif args.command == "names":
            print("\n".join(IMAGE_NAMES))
        elif args.command == "export":
            for name in export_images(cache_dir()):
                print(f"images: {name} is not built, not exported", file=sys.stderr)
        else:
            load_images(args.ctr, args.address)
    except ImageError as exc:
        print(f"images: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
