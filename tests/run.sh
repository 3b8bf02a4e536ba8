#!/usr/bin/env bash
# The whole suite as `make test` runs it, with the local servers' environment already set (with-servers.sh):
# first everything but the chaos tests and the kill -9 runs at scale on TEST_WORKERS processes; then the kill -9
# runs at scale (marked `alone`: their limits assume the machine to themselves) one at a time; then the chaos
# tests, last, since they stop, flush and restart the servers the others share. Every part always runs; the exit
# status fails if any failed.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
pytest="$here/../.venv/bin/pytest"
workers="${TEST_WORKERS:-2}"
"$pytest" -q -p no:cacheprovider -n "$workers" --dist worksteal -m "not chaos and not alone" --durations=30
parallel=$?
"$pytest" -q -p no:cacheprovider -m alone --durations=5
alone=$?
"$pytest" -q -p no:cacheprovider -m chaos --durations=10
chaos=$?
echo "suite: parallel part exit $parallel, kill -9 at scale exit $alone, chaos exit $chaos"
# 5 (no tests collected) is a failure too: a part that checked nothing must not pass
[ "$parallel" -eq 0 ] && [ "$alone" -eq 0 ] && [ "$chaos" -eq 0 ]
