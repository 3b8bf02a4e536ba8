#!/usr/bin/env bash
# Start the local servers (deploy/local/up.sh), run the given command with their environment,
# and stop them again whatever the command's outcome. Exit status is the command's.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
state="${FOLDLINE_LOCAL_DIR:-$repo/.local}"
trap 'bash "$here/down.sh" >/dev/null 2>&1 || true' EXIT
bash "$here/up.sh"
# shellcheck disable=SC1091
source "$state/env.sh"
"$@"
