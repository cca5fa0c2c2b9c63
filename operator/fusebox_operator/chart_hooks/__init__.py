"""The chart's Helm hooks: `python -m fusebox_operator.chart_hooks apply-crds|guard-uninstall`.

Why a package of its own, run as a Job from the operator's image: Helm installs
the CRDs in crds/ once and never upgrades them, and `helm uninstall` removes the
operator while InferenceServices still carry kopf's finalizer. The pre-upgrade
hook server-side applies the chart's CRDs; the pre-delete hook refuses (or
first deletes the services) while the operator can still release them.

`crds` and `services` are pure (what to apply, which services count, what to
say); `cluster` is the only part that talks to the API server; `cli` ties them.
"""
