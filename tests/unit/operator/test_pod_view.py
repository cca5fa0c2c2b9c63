"""kube._pod_view: what the operator reads from a pod's status."""

from __future__ import annotations

from kubernetes.client import (
    V1ContainerState,
    V1ContainerStateTerminated,
    V1ContainerStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodCondition,
    V1PodStatus,
)

from fusebox_operator.kube import _pod_view
from fusebox_operator.manifests import SERVER_CONTAINER, SIDECAR_CONTAINER


def status(name: str, *, ready: bool, restarts: int = 0, oom: bool = False) -> V1ContainerStatus:
    killed = V1ContainerStateTerminated(exit_code=137, reason="OOMKilled")
    last = V1ContainerState(terminated=killed)
    return V1ContainerStatus(
        name=name,
        image="i",
        image_id="",
        ready=ready,
        started=ready,
        restart_count=restarts,
        last_state=last if oom else None,
    )


def pod(*, sidecar_ready: bool) -> V1Pod:
    return V1Pod(
        metadata=V1ObjectMeta(name="p", uid="u"),
        status=V1PodStatus(
            phase="Running",
            pod_ip="10.0.0.9",
            conditions=[V1PodCondition(type="Ready", status="True")],
            # The sidecar is native: the kubelet reports it among the init containers.
            init_container_statuses=[status(SIDECAR_CONTAINER, ready=sidecar_ready)],
            container_statuses=[status(SERVER_CONTAINER, ready=True, restarts=2, oom=True)],
        ),
    )


def test_the_native_sidecars_readiness_is_read_from_the_init_container_statuses() -> None:
    assert _pod_view(pod(sidecar_ready=True)).sidecar_ready
    assert not _pod_view(pod(sidecar_ready=False)).sidecar_ready


def test_the_servers_start_restarts_and_oom_come_from_its_own_status() -> None:
    view = _pod_view(pod(sidecar_ready=True))
    assert view.server_started
    assert view.server_restarts == 2
    assert view.oom_killed
    assert view.ready
