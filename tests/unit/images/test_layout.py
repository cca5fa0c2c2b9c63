"""What the loader decides to send to containerd, on real OCI layouts written
to a temporary directory: unchanged images are skipped, changed ones travel
with only the blobs containerd lacks, and the layout never keeps dead blobs."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

from localcluster import images

CTR_LISTING = """\
REF                             TYPE                                       DIGEST                                                                  SIZE      PLATFORMS   LABELS
localhost/fusebox/pause:latest  application/vnd.oci.image.manifest.v1+json sha256:aaaa                                                             682.9 KiB linux/amd64 io.cri-containerd.image=managed
localhost/fusebox/operator:dev  application/vnd.oci.image.manifest.v1+json sha256:bbbb                                                             290.1 MiB linux/amd64 -
sha256:cf1fe7644c34             application/vnd.oci.image.manifest.v1+json sha256:aaaa                                                             682.9 KiB linux/amd64 io.cri-containerd.image=managed
"""  # noqa: E501


def _blob(layout: Path, payload: bytes) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(payload).hexdigest()
    path = layout / "blobs" / "sha256" / digest.split(":")[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    return {"mediaType": "application/octet-stream", "digest": digest, "size": len(payload)}


def _image(layout: Path, tag: str, layers: list[bytes]) -> dict[str, Any]:
    """Writes a config, layers and manifest; returns the manifest descriptor."""
    manifest = {
        "schemaVersion": 2,
        "config": _blob(layout, f"config of {tag}".encode()),
        "layers": [_blob(layout, layer) for layer in layers],
    }
    descriptor = _blob(layout, json.dumps(manifest).encode())
    descriptor["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
    return descriptor


def _write_index(layout: Path, entries: list[tuple[str | None, dict[str, Any]]]) -> None:
    manifests = []
    for name, descriptor in entries:
        entry = dict(descriptor)
        if name is not None:
            entry["annotations"] = {"org.opencontainers.image.ref.name": name}
        manifests.append(entry)
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": manifests}))


def test_ctr_listing_gives_each_name_its_manifest_digest() -> None:
    assert images.parse_ctr_images(CTR_LISTING) == {
        "localhost/fusebox/pause:latest": "sha256:aaaa",
        "localhost/fusebox/operator:dev": "sha256:bbbb",
        "sha256:cf1fe7644c34": "sha256:aaaa",
    }


def test_an_image_id_no_name_points_at_any_more_is_dropped_and_a_current_one_kept() -> None:
    in_containerd = {
        "localhost/fusebox/inference:dev": "sha256:new",
        "sha256:id-of-new": "sha256:new",  # the CRI's id reference of the current image
        "sha256:id-of-old": "sha256:old",  # the image the name pointed at before a rebuild
        "sha256:id-of-older": "sha256:older",
    }
    assert images.superseded_image_ids(in_containerd) == ["sha256:id-of-old", "sha256:id-of-older"]
    assert images.superseded_image_ids({"sha256:x": "sha256:a", "a:1": "sha256:a"}) == []


def test_only_images_whose_manifest_changed_or_is_absent_are_stale() -> None:
    layout = {
        "a:1": images.Descriptor("m", "sha256:same", 1),
        "b:1": images.Descriptor("m", "sha256:new", 1),
        "c:1": images.Descriptor("m", "sha256:c", 1),
    }
    in_containerd = {"a:1": "sha256:same", "b:1": "sha256:old"}
    wanted = ["a:1", "b:1", "c:1", "never-built:1"]
    assert images.stale_images(wanted, layout, in_containerd) == ["b:1", "c:1"]


def test_unnamed_index_entries_are_not_images(tmp_path: Path) -> None:
    named = _image(tmp_path, "new", [b"layer"])
    replaced = _image(tmp_path, "old", [b"old layer"])
    _write_index(tmp_path, [(None, replaced), ("localhost/fusebox/x:dev", named)])
    found = images.manifests_by_name(json.loads((tmp_path / "index.json").read_text()))
    assert list(found) == ["localhost/fusebox/x:dev"]
    assert found["localhost/fusebox/x:dev"].digest == named["digest"]


def test_prune_drops_replaced_images_and_their_blobs_but_keeps_shared_ones(
    tmp_path: Path,
) -> None:
    shared = b"torch layer shared by both versions"
    current = _image(tmp_path, "v2", [shared, b"code v2"])
    replaced = _image(tmp_path, "v1", [shared, b"code v1"])
    _write_index(tmp_path, [(None, replaced), ("localhost/fusebox/inference:dev", current)])

    images._prune_layout(tmp_path)

    index = json.loads((tmp_path / "index.json").read_text())
    assert [m["digest"] for m in index["manifests"]] == [current["digest"]]
    remaining = {p.name for p in (tmp_path / "blobs" / "sha256").iterdir()}
    assert hashlib.sha256(shared).hexdigest() in remaining
    assert hashlib.sha256(b"code v2").hexdigest() in remaining
    assert hashlib.sha256(b"code v1").hexdigest() not in remaining
    assert replaced["digest"].split(":")[1] not in remaining


def test_import_archive_carries_only_the_named_images_and_the_missing_blobs(
    tmp_path: Path,
) -> None:
    big = b"a big layer containerd already has"
    descriptor = _image(tmp_path, "v2", [big, b"new code"])
    other = _image(tmp_path, "other", [b"unrelated"])
    _write_index(tmp_path, [("localhost/fusebox/inference:dev", descriptor), ("o:1", other)])
    in_layout = images.manifests_by_name(json.loads((tmp_path / "index.json").read_text()))
    manifest = json.loads((tmp_path / "blobs/sha256" / descriptor["digest"][7:]).read_bytes())
    needed = [descriptor["digest"], manifest["config"]["digest"], manifest["layers"][1]["digest"]]

    sink = io.BytesIO()
    images._stream_import(tmp_path, ["localhost/fusebox/inference:dev"], in_layout, needed, sink)

    sink.seek(0)
    with tarfile.open(fileobj=sink) as archive:
        members = {m.name: archive.extractfile(m).read() for m in archive if m.isfile()}  # type: ignore[union-attr]
    index = json.loads(members.pop("index.json"))
    assert [m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]] == [
        "localhost/fusebox/inference:dev"
    ]
    assert json.loads(members.pop("oci-layout")) == {"imageLayoutVersion": "1.0.0"}
    assert sorted(members) == sorted(f"blobs/sha256/{d[7:]}" for d in needed)
    assert members[f"blobs/sha256/{manifest['layers'][1]['digest'][7:]}"] == b"new code"


def test_every_image_folder_but_the_base_becomes_a_pod_image(tmp_path: Path) -> None:
    for folder in ("base", "pause", "testapp"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "Dockerfile").write_text("FROM scratch\n")
    (tmp_path / "notes").mkdir()  # no Dockerfile: not an image
    assert images.discover_image_names(tmp_path) == (
        "localhost/fusebox/pause:latest",
        "localhost/fusebox/testapp:latest",
        "localhost/fusebox/operator:dev",
        "localhost/fusebox/inference:dev",
    )


def test_podman_storage_lives_in_the_cache(tmp_path: Path) -> None:
    argv = images.podman_argv(tmp_path)
    assert argv[argv.index("--root") + 1] == str(tmp_path / "podman" / "root")
    assert argv[argv.index("--runroot") + 1] == str(tmp_path / "podman" / "run")
    assert argv[argv.index("--runtime") + 1] == "runc"  # crun refuses hybrid cgroups here
