"""`kubectl fusebox`: read and steer Fusebox services through the API server only.

`views` holds what is printed and written (pure), `cli` the arguments and the
API calls. Run as `kubectl fusebox ...` (the `kubectl-fusebox` console script,
or bin/kubectl-fusebox) or `python -m fusebox_operator.kubectl_plugin ...`.
"""
