"""pod_view.pod_view: what the operator reads from a pod as the API serves it."""

from __future__ import annotations

import datetime as dt

from kubernetes.client import (
    V1ContainerState,
    V1ContainerStateRunning,
    V1ContainerStateTerminated,
    V1ContainerStateWaiting,
    V1ContainerStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodCondition,
    V1PodStatus,
)

from fusebox_contract.model_fetch import FETCH_CONTAINER, FetchReason, FetchReport
from fusebox_operator.manifests import SERVER_CONTAINER, SIDECAR_CONTAINER

from .served import view_of


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
    assert view_of(pod(sidecar_ready=True)).sidecar_ready
    assert not view_of(pod(sidecar_ready=False)).sidecar_ready


def test_the_servers_start_restarts_and_oom_come_from_its_own_status() -> None:
    view = view_of(pod(sidecar_ready=True))
    assert view.server_started
    assert view.server_restarts == 2
    assert view.oom_killed
    assert view.ready


def waiting_server(reason: str, message: str, last_exit: int | None) -> V1ContainerStatus:
    last = (
        V1ContainerState(terminated=V1ContainerStateTerminated(exit_code=last_exit, reason="Error"))
        if last_exit is not None
        else None
    )
    return V1ContainerStatus(
        name=SERVER_CONTAINER,
        image="i",
        image_id="",
        ready=False,
        restart_count=3,
        state=V1ContainerState(waiting=V1ContainerStateWaiting(reason=reason, message=message)),
        last_state=last,
    )


def pod_with(server: V1ContainerStatus) -> V1Pod:
    return V1Pod(
        metadata=V1ObjectMeta(name="p", uid="u"),
        status=V1PodStatus(phase="Running", container_statuses=[server]),
    )


def test_a_crash_looping_server_is_failing_with_its_last_exit() -> None:
    server = waiting_server("CrashLoopBackOff", "back-off 40s restarting", last_exit=1)
    assert view_of(pod_with(server)).failing == (
        "server CrashLoopBackOff (last exit 1: Error): back-off 40s restarting"
    )


def test_an_image_that_cannot_be_pulled_is_failing() -> None:
    server = waiting_server("ImagePullBackOff", 'Back-off pulling image "x"', last_exit=None)
    assert (
        view_of(pod_with(server)).failing == 'server ImagePullBackOff: Back-off pulling image "x"'
    )


def test_a_container_still_being_created_is_not_failing() -> None:
    server = waiting_server("ContainerCreating", "", last_exit=None)
    assert view_of(pod_with(server)).failing == ""


def test_a_crash_looping_server_between_back_offs_is_still_failing() -> None:
    # The kubelet runs it again after each back-off: running, not ready, last run failed.
    server = waiting_server("CrashLoopBackOff", "", last_exit=1)
    server.state = V1ContainerState(running=V1ContainerStateRunning())
    assert view_of(pod_with(server)).failing == "server restarted 3 time(s) (last exit 1: Error)"
    server.ready = True
    assert view_of(pod_with(server)).failing == ""


def test_a_server_that_just_exited_non_zero_is_failing_before_its_back_off() -> None:
    server = waiting_server("CrashLoopBackOff", "", last_exit=None)
    ended = V1ContainerStateTerminated(exit_code=1, reason="Error")
    server.state = V1ContainerState(terminated=ended)
    assert view_of(pod_with(server)).failing == "server exited 1: Error"


def test_the_servers_own_last_words_replace_the_kubelets_back_off_message() -> None:
    server = waiting_server("CrashLoopBackOff", "back-off 40s restarting", last_exit=2)
    words = "fusebox_server: --model-dir /models/m/x: not a directory"
    assert server.last_state is not None and server.last_state.terminated is not None
    server.last_state.terminated.message = f"first line\n{words}\n\n"
    expected = f"server CrashLoopBackOff (last exit 2: Error): {words}"
    assert view_of(pod_with(server)).failing == expected
    server.state = V1ContainerState(running=V1ContainerStateRunning())
    assert view_of(pod_with(server)).failing.endswith(f"(last exit 2: Error): {words}")


def test_a_server_that_just_exited_is_quoted_and_a_long_line_is_cut() -> None:
    server = waiting_server("CrashLoopBackOff", "", last_exit=None)
    ended = V1ContainerStateTerminated(exit_code=1, reason="Error", message="x" * 500)
    server.state = V1ContainerState(terminated=ended)
    assert view_of(pod_with(server)).failing == "server exited 1: Error: " + "x" * 160


def test_a_terminating_pods_grace_ends_at_its_deletion_timestamp() -> None:
    running = pod(sidecar_ready=True)
    assert not view_of(running).terminating
    assert view_of(running).grace_ends_at is None
    deadline = dt.datetime(2027, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    running.metadata.deletion_timestamp = deadline
    view = view_of(running)
    assert view.terminating
    assert view.grace_ends_at == deadline.timestamp()


def fetch_status(exit_code: int, message: str, running_again: bool = False) -> V1ContainerStatus:
    ended = V1ContainerStateTerminated(exit_code=exit_code, reason="Error", message=message)
    now = V1ContainerState(running=V1ContainerStateRunning()) if running_again else None
    return V1ContainerStatus(
        name=FETCH_CONTAINER,
        image="i",
        image_id="",
        ready=False,
        restart_count=1 if running_again else 0,
        state=now or V1ContainerState(terminated=ended),
        last_state=V1ContainerState(terminated=ended) if running_again else None,
    )


def test_the_model_fetchers_report_is_read_from_its_termination_message() -> None:
    refused = FetchReport(FetchReason.BAD_CREDENTIALS, "s3: SignatureDoesNotMatch")
    fetching = V1Pod(
        metadata=V1ObjectMeta(name="p", uid="u"),
        status=V1PodStatus(
            phase="Pending", init_container_statuses=[fetch_status(1, refused.dumps())]
        ),
    )
    view = view_of(fetching)
    assert view.fetch is not None and view.fetch.failed and view.fetch.report == refused
    # Its failure is the pod's: the server never starts behind it.
    assert view.failing.startswith(f"{FETCH_CONTAINER} exited 1: Error")
    assert view_of(pod(sidecar_ready=True)).fetch is None  # a local source has no fetcher


def test_a_fetcher_retrying_after_a_failure_still_carries_that_failure() -> None:
    refused = FetchReport(FetchReason.NOT_FOUND, "bucket models does not exist")
    retrying = V1Pod(
        metadata=V1ObjectMeta(name="p", uid="u"),
        status=V1PodStatus(
            phase="Pending",
            init_container_statuses=[fetch_status(1, refused.dumps(), running_again=True)],
        ),
    )
    view = view_of(retrying)
    assert view.fetch is not None and view.fetch.running and view.fetch.failed
    assert view.fetch.report == refused


def test_a_pending_pod_whose_sidecar_is_ready_beside_a_running_fetcher_is_downloading() -> None:
    running = V1ContainerStatus(
        name=FETCH_CONTAINER,
        image="i",
        image_id="",
        ready=False,
        restart_count=0,
        state=V1ContainerState(running=V1ContainerStateRunning()),
    )

    def pending(sidecar_ready: bool, ip: str = "10.0.0.9") -> V1Pod:
        return V1Pod(
            metadata=V1ObjectMeta(name="p", uid="u"),
            status=V1PodStatus(
                phase="Pending",
                pod_ip=ip,
                init_container_statuses=[status(SIDECAR_CONTAINER, ready=sidecar_ready), running],
            ),
        )

    view = view_of(pending(sidecar_ready=True))
    assert view.downloading and not view.scrapable  # its fetch figures only
    assert not view_of(pending(sidecar_ready=False)).downloading
    assert not view_of(pending(sidecar_ready=True, ip="")).downloading
    assert not view_of(pod(sidecar_ready=True)).downloading  # no fetcher
