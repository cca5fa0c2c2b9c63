"""`python -m fusebox_operator`: run the kopf operator with explicit settings.

Why a module and not the `kopf run` CLI: the watch scope, peering and the
liveness endpoint come from the same env vars the Helm chart sets
(settings.py), and the handlers module is imported here so there is no path
argument to get wrong.

`python -m fusebox_operator render FILE ...` prints the children the operator
would create, without a cluster (render.py); kopf is not even imported then.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fusebox_operator.settings import OperatorSettings

SETTINGS_HELP = """settings (environment variables, see docs/operator.md):
  FUSEBOX_INFERENCE_IMAGE       image of the server and sidecar containers
  FUSEBOX_WATCH_NAMESPACES      comma-separated namespaces; empty = all
  FUSEBOX_PEERING               auto | standalone | <peering name>
  FUSEBOX_OPERATOR_REPLICAS     operator replicas (auto peering when > 1)
  FUSEBOX_PEERING_PRIORITY      this replica's peering priority (default: drawn at start)
  FUSEBOX_OPERATOR_NAMESPACE    namespace of the operator pods (NetworkPolicy)
  FUSEBOX_OPERATOR_POD_SELECTOR labels of the operator pods (NetworkPolicy)
  FUSEBOX_MONITORING_NAMESPACE  namespace allowed to scrape the sidecars
  FUSEBOX_LIVENESS_PORT         port of /healthz (default 8080)
  FUSEBOX_METRICS_PORT          port of the operator's /metrics (default 9401; 0: none)
  FUSEBOX_LOG_LEVEL             DEBUG | INFO | WARNING | ERROR
credentials: in-cluster service account, else KUBECONFIG / ~/.kube/config"""


class TimerTickFilter(logging.Filter):
    """Drop kopf's "Timer ... succeeded." line of the telemetry timers, which wake every
    service every second or 2.5 s: one line per wake-up says nothing the status does not.

    Every timer's id, not one: the coarse timer's line (the default 5 s interval's) escaped
    this filter while it named only the first timer. A log of lines that say nothing is
    the reason; CPU is not: kopf builds the record before any filter sees it, and the
    line's share of a new service's CPU is under a millisecond
    (decisions/operator-api-cost.md, sixth pass). A failed tick is still logged (kopf's
    line says "failed").
    """

    def __init__(self, timer_ids: Sequence[str]) -> None:
        super().__init__()
        self.dropped = frozenset(f"Timer {timer_id!r} succeeded." for timer_id in timer_ids)

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in self.dropped


def peering_priority(configured: int) -> int:
    """The configured priority, else a random one: with peering, kopf pauses
    every operator that shares the highest priority, so two replicas started
    from one Deployment (same env) would both stand still."""
    return configured or secrets.randbelow(2**31 - 1) + 1


RENDER_COMMAND = "render"


def bounded_login(connections: int | None) -> Callable[..., Awaitable[Any]]:
    """kopf's login with the client library's credentials (kopf's own default), handed
    to kopf as a session whose pool holds at most `connections` (kube.KOPF_REQUEST_CONNECTIONS):
    kopf's own pool is unbounded, and its idle connections were the operator's largest
    memory per service (docs/decisions/operator-memory.md)."""
    import kopf

    from fusebox_operator.kube import api_session

    async def login(**kwargs: Any) -> kopf.AiohttpSession | None:
        info = kopf.login_via_client(**kwargs)
        if info is None:
            return None
        session = api_session(
            info.as_ssl_context(),
            info.as_http_headers(),
            connections,
            proxy=info.proxy_url,
            trust_env=info.trust_env,
        )
        return kopf.AiohttpSession(
            aiohttp_session=session,
            server=info.server,
            default_namespace=info.default_namespace,
            priority=info.priority,
            expiration=info.expiration,
        )

    return login


def main(argv: Sequence[str] | None = None) -> None:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == [RENDER_COMMAND]:
        from fusebox_operator import render  # no kopf, no cluster

        raise SystemExit(render.main(arguments[1:]))
    argparse.ArgumentParser(
        prog="python -m fusebox_operator",
        description="Run the Fusebox operator (kopf) for InferenceService objects. "
        f"`{RENDER_COMMAND} FILE` prints the objects it would create instead (see "
        f"`python -m fusebox_operator {RENDER_COMMAND} --help`).",
        epilog=SETTINGS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(arguments)
    run_operator()


def run_operator() -> None:
    import kopf

    from fusebox_operator import handlers, operator_metrics
    from fusebox_operator.kube import kopf_connection_limit

    try:
        ours = OperatorSettings.from_env(os.environ)
    except ValueError as error:
        raise SystemExit(f"fusebox-operator: bad setting: {error}") from error
    # kopf's own handler (no second root handler); log_prefix names the object,
    # "[namespace/name]", on every handler line, so a log says which service it is about.
    kopf.configure(verbose=False, log_prefix=True)
    logging.getLogger().setLevel(os.environ.get("FUSEBOX_LOG_LEVEL", "INFO").upper())
    logging.getLogger("kopf.objects").addFilter(TimerTickFilter(handlers.TELEMETRY_TIMER_IDS))
    assert handlers.GROUP  # imported for its decorators
    if ours.metrics_port:
        try:
            operator_metrics.serve(operator_metrics.METRICS, ours.metrics_port)
        except OSError as error:  # taken, or not ours to bind: say which setting
            raise SystemExit(
                f"fusebox-operator: cannot serve metrics on FUSEBOX_METRICS_PORT="
                f"{ours.metrics_port}: {error}"
            ) from error
    kopf.on.login(id="login-bounded-pool")(bounded_login(kopf_connection_limit(ours)))
    kopf.run(
        standalone=ours.standalone,
        peering_name=None if ours.standalone else ours.peering_name,
        priority=peering_priority(ours.peering_priority),
        clusterwide=not ours.watch_namespaces,
        namespaces=list(ours.watch_namespaces),
        liveness_endpoint=f"http://0.0.0.0:{ours.liveness_port}/healthz",
    )


if __name__ == "__main__":
    main()
