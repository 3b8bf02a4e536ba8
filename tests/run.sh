#!/usr/bin/env bash
# The whole suite as `make test` runs it, with the local servers' environment already set (with-servers.sh):
# first everything but the chaos tests on TEST_WORKERS processes, then the chaos tests alone (they stop and
# flush the servers the others share). Both parts always run; the exit status fails if either failed.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
pytest="$here/../.venv/bin/pytest"
workers="${TEST_WORKERS:-2}"
"$pytest" -q -p no:cacheprovider -n "$workers" --dist worksteal -m "not chaos" --durations=30
parallel=$?
"$pytest" -q -p no:cacheprovider -m chaos --durations=10
chaos=$?
echo "suite: parallel part exit $parallel, chaos part exit $chaos"
# 5 (no tests collected) is a failure too: a part that checked nothing must not pass
[ "$parallel" -eq 0 ] && [ "$chaos" -eq 0 ]
