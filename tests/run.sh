#!/usr/bin/env bash
# The whole suite as `make test` runs it, with the local servers' environment already set (with-servers.sh):
# first everything but the chaos tests on TEST_WORKERS processes, then the chaos tests (they stop and flush the
# servers the others share) and the kill -9 runs at scale (their limits assume the machine to themselves) one
# at a time. Both parts always run; the exit status fails if either failed.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
pytest="$here/../.venv/bin/pytest"
workers="${TEST_WORKERS:-2}"
"$pytest" -q -p no:cacheprovider -n "$workers" --dist worksteal -m "not chaos and not alone" --durations=30
parallel=$?
"$pytest" -q -p no:cacheprovider -m "chaos or alone" --durations=15
chaos=$?
echo "suite: parallel part exit $parallel, one-at-a-time part exit $chaos"
# 5 (no tests collected) is a failure too: a part that checked nothing must not pass
[ "$parallel" -eq 0 ] && [ "$chaos" -eq 0 ]
