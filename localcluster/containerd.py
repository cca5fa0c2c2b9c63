"""The node's containerd, driven through `ctr`: images in, containers out.

Loading goes through localcluster/images.py (the images part's contract:
`load_images(ctr, address, names=None)`); teardown kills every task while
containerd still runs, and works out the shims' socket paths so none is
left in /run/containerd/s.
"""

from __future__ import annotations

import importlib
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

from localcluster import hostchanges
from localcluster.components import CONTAINERD_BIN_DIR, Layout
from localcluster.config import ClusterConfig
from localcluster.progress import ClusterError, Reporter

CTR = str(CONTAINERD_BIN_DIR / "ctr")  # the built one, of the version that runs
K8S_NAMESPACE = "k8s.io"


def ctr(config: ClusterConfig, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CTR, f"--address={config.containerd_socket}", "--namespace", K8S_NAMESPACE, *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=60,
    )


def ctr_ok(config: ClusterConfig) -> bool:
    return config.containerd_socket.exists() and ctr(config, "version").returncode == 0


def image_reference(name: str) -> str:
    """`testapp` -> `localhost/fusebox/testapp:latest`; full references pass through. Pure."""
    if "/" in name:
        return name
    return f"localhost/fusebox/{name}" + ("" if ":" in name else ":latest")


def load_images(
    config: ClusterConfig,
    only: tuple[str, ...] | None = None,
    *,
    discard_unpacked_layers: bool = False,
) -> None:
    """Load built images (all, or `only` these) through the images module;
    `discard_unpacked_layers` keeps the unpacked snapshots only (images.load_images)."""
    try:
        images = importlib.import_module("localcluster.images")
    except ModuleNotFoundError as err:
        raise ClusterError(
            "localcluster/images.py is missing, so no image can be loaded: run `make images`"
        ) from err
    load: Callable[..., None] = images.load_images
    names = None if only is None else [image_reference(n) for n in only]
    try:
        load(
            CTR,
            str(config.containerd_socket),
            names=names,
            discard_unpacked_layers=discard_unpacked_layers,
        )
    except RuntimeError as err:  # images.ImageError: its message names the make target
        raise ClusterError(f"loading images: {err}") from err


def load_images_into_running(
    config: ClusterConfig,
    only: tuple[str, ...] | None = None,
    *,
    discard_unpacked_layers: bool = False,
) -> None:
    if not ctr_ok(config):
        raise ClusterError(
            f"containerd of {config.node_name} ({config.name!r}) is not running: run `up` first"
        )
    load_images(config, only, discard_unpacked_layers=discard_unpacked_layers)
    if only is not None:  # asked for by name: one never built is an error, not a warning
        require_images(config, tuple(image_reference(n) for n in only))


def require_images(config: ClusterConfig, names: tuple[str, ...]) -> None:
    listed = set(ctr(config, "images", "ls", "-q").stdout.split())
    missing = [n for n in names if n not in listed]
    if missing:
        raise ClusterError(f"images missing from the node: {', '.join(missing)}: run `make images`")


def task_bundles(layout: Layout) -> list[Path]:
    tasks = layout.containerd / "state" / "io.containerd.runtime.v2.task" / K8S_NAMESPACE
    return sorted(tasks.iterdir()) if tasks.is_dir() else []


def shim_socket_in(bundle: Path) -> Path | None:
    """The socket of a task's shim, as its bundle records it; None when unreadable.

    containerd 2.3+ writes `bootstrap.json` (`{"address": "unix://..."}`);
    earlier versions wrote the address alone to `address`.
    """
    try:
        address = str(json.loads((bundle / "bootstrap.json").read_text())["address"])
    except (OSError, ValueError, KeyError, TypeError):
        try:
            address = (bundle / "address").read_text().strip()
        except OSError:
            return None
    return Path(address.removeprefix("unix://")) if address else None


def kill_containers(config: ClusterConfig, report: Reporter) -> list[str]:
    """Kill every task while containerd still runs; return the pods' netns names."""
    if not ctr_ok(config):
        return []
    netns_names: list[str] = []
    for container_id in ctr(config, "containers", "ls", "-q").stdout.split():
        info = ctr(config, "containers", "info", container_id)
        if info.returncode != 0:
            continue
        try:
            spec = json.loads(info.stdout).get("Spec") or {}
        except json.JSONDecodeError:
            continue
        for ns in spec.get("linux", {}).get("namespaces", []):
            path = ns.get("path", "")
            if ns.get("type") == "network" and "/netns/" in path:
                netns_names.append(Path(path).name)
    tasks = ctr(config, "tasks", "ls", "-q").stdout.split()
    if tasks:
        report.say(f"killing {len(tasks)} containers")
    for task in tasks:
        ctr(config, "tasks", "kill", "--all", "--signal", "SIGKILL", task)
    for task in tasks:
        ctr(config, "tasks", "delete", "--force", task)
    return sorted(set(netns_names))


def shim_socket_of(args: list[str]) -> Path | None:
    if not args or Path(args[0]).name != "containerd-shim-runc-v2":
        return None
    flags = dict(zip(args[1::], args[2::], strict=False))
    try:
        return hostchanges.shim_socket(flags["-address"], flags["-namespace"], flags["-id"])
    except KeyError:
        return None
