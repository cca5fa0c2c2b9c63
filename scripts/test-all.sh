#!/usr/bin/env bash
# Runs every test tier the way CI does: the e2e tier (the cluster's, mostly
# waiting on pods, ladders and cool-offs) in the foreground, and the unit and
# integration tiers (processes on loopback, no cluster) beside it, so their
# ten-odd CPU-bound minutes overlap the e2e tier's waiting instead of adding
# to it. The side tiers' output is kept in a file and printed whole when the
# e2e tier ends (two live pytest logs would interleave line by line); the
# exit status is non-zero when either failed. Arguments go to both pytest runs.
set -uo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
side_log=$(mktemp -t fusebox-unit-integration.XXXXXX.log)
trap 'rm -f "$side_log"' EXIT

echo "test-all: unit and integration tiers started beside the e2e tier (their log follows the e2e tier's)"
# -p no:cacheprovider: the two sessions must not write one .pytest_cache at once.
"$py" -m pytest -p no:cacheprovider --durations=20 "$@" tests/unit tests/integration >"$side_log" 2>&1 &
side=$!

"$py" -m pytest --durations=40 "$@" tests/e2e
e2e_status=$?

wait "$side"
side_status=$?
echo
echo "================ unit and integration tiers (run beside the e2e tier) ================"
cat "$side_log"
echo "test-all: e2e tier exited $e2e_status, unit and integration tiers exited $side_status"
if [ "$e2e_status" -ne 0 ] || [ "$side_status" -ne 0 ]; then
  exit 1
fi
