#!/usr/bin/env bash
# Runs every test tier the way CI does, in two lanes:
#  - foreground: the e2e tier on the default cluster (mostly waiting on pods,
#    ladders and cool-offs);
#  - beside it: the unit and integration tiers (processes on loopback, no
#    cluster), then the multinode e2e module, which brings up a 3-node
#    cluster of its own (its name, namespaces, veths and subnets are not the
#    default cluster's; tests/e2e/multinode/conftest.py) and so needs nothing
#    of the foreground lane.
# The side lane's ten-odd CPU-bound minutes and the multinode cluster's
# start-up overlap the e2e tier's waiting instead of adding to it. The side
# lane's output is kept in a file and printed whole when the e2e tier ends
# (two live pytest logs would interleave line by line); the exit status is
# non-zero when either lane failed. Arguments go to every pytest run.
set -uo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
side_log=$(mktemp -t fusebox-side-lane.XXXXXX.log)
trap 'rm -f "$side_log"' EXIT
multinode=tests/e2e/multinode

side_lane() {
  # -p no:cacheprovider: the sessions must not write one .pytest_cache at once.
  # Niced: the e2e tier is the longer lane and its waits (pods starting, ladders) need
  # the CPU when they need it; these CPU-bound tiers take what it leaves. Not the
  # multinode module: its cluster's pods wait on CPU like the e2e tier's.
  nice -n 10 "$py" -m pytest -p no:cacheprovider --durations=20 "$@" tests/unit tests/integration
  local tiers=$?
  echo
  echo "================ multinode e2e module (after the unit and integration tiers) ================"
  "$py" -m pytest -p no:cacheprovider --durations=10 "$@" "$multinode"
  local nodes=$?
  # Arguments that select no multinode test (say, -k of a unit test) are not a failure.
  if [ "$nodes" -eq 5 ] && [ $# -gt 0 ]; then nodes=0; fi
  echo "side lane: unit and integration tiers exited $tiers, multinode module exited $nodes"
  [ "$tiers" -eq 0 ] && [ "$nodes" -eq 0 ]
}

echo "test-all: unit and integration tiers, then the multinode module, started beside the e2e tier (their log follows the e2e tier's)"
side_lane "$@" >"$side_log" 2>&1 &
side=$!

"$py" -m pytest --durations=40 "$@" tests/e2e --ignore="$multinode"
e2e_status=$?

wait "$side"
side_status=$?
echo
echo "================ side lane: unit and integration tiers, then the multinode module ================"
cat "$side_log"
echo "test-all: e2e tier exited $e2e_status, side lane exited $side_status"
if [ "$e2e_status" -ne 0 ] || [ "$side_status" -ne 0 ]; then
  exit 1
fi
