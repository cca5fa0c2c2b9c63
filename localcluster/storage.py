"""Directory-backed PersistentVolumes of the `local` StorageClass.

Restricted Pod Security forbids hostPath volumes, so a model directory on
this machine reaches a pod as a `local` PV bound through a PVC (the
`pvc://CLAIM/path` model source). The PV pins itself to the node; the pod's
non-root user (uid 65532 in our images) must be able to read the directory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from localcluster.addons import STORAGE_CLASS
from localcluster.config import ClusterConfig

POD_UID = 65532


class StorageError(ValueError):
    """The directory cannot back a PV (missing, not a directory, unreadable by pods)."""


def check_directory(path: Path) -> None:
    if not path.is_absolute():
        raise StorageError(f"{path}: give an absolute path")
    if not path.is_dir():
        raise StorageError(f"{path}: no such directory")
    mode = path.stat()
    readable_by_owner = (
        mode.st_uid == POD_UID and mode.st_mode & stat.S_IRUSR and mode.st_mode & stat.S_IXUSR
    )
    readable_by_others = mode.st_mode & stat.S_IROTH and mode.st_mode & stat.S_IXOTH
    if not (readable_by_owner or readable_by_others):
        raise StorageError(
            f"{path}: pods run as uid {POD_UID} and could not read it; "
            f"run `chmod -R o+rX {path}` or `chown -R {POD_UID} {path}`"
        )


def persistent_volume(
    config: ClusterConfig, *, name: str, path: Path, size: str, access_mode: str
) -> dict[str, Any]:
    """A `local` PV on this cluster's node. Pure."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {"fusebox.dev/localcluster-pv": "true"}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": [access_mode],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            "volumeMode": "Filesystem",
            "local": {"path": os.path.normpath(path)},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [config.node_name],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }
