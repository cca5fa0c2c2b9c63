"""`python -m fusebox_operator`: run the kopf operator with explicit settings.

Why a module and not the `kopf run` CLI: the watch scope, peering and the
liveness endpoint come from the same env vars the Helm chart sets
(settings.py), and the handlers module is imported here so there is no path
argument to get wrong.
"""

from __future__ import annotations

import logging
import os

import kopf

from fusebox_operator import handlers
from fusebox_operator.settings import OperatorSettings


def main() -> None:
    ours = OperatorSettings.from_env(os.environ)
    logging.basicConfig(
        level=os.environ.get("FUSEBOX_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    kopf.configure(verbose=False)
    assert handlers.GROUP  # imported for its decorators
    kopf.run(
        standalone=ours.standalone,
        peering_name=None if ours.standalone else ours.peering_name,
        clusterwide=not ours.watch_namespaces,
        namespaces=list(ours.watch_namespaces),
        liveness_endpoint=f"http://0.0.0.0:{ours.liveness_port}/healthz",
    )


if __name__ == "__main__":
    main()
