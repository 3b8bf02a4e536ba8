#!/usr/bin/env bash
# deploy/local/promtool.sh install — make `promtool` available; prints its path.
#
# promtool ships in Debian's `prometheus` package (installed with apt-get,
# no recommends; the package's own prometheus service is never started).
# A symlink $STATE/bin/promtool is made for scripts that prefer $STATE/bin.
set -euo pipefail
# shellcheck source=deploy/local/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

install() {
  command -v promtool >/dev/null || apt_install prometheus
  local path; path=$(command -v promtool) || die "promtool not found after installing prometheus"
  mkdir -p "$STATE/bin"
  ln -sf "$path" "$STATE/bin/promtool"
  echo "$path"
}

case "${1:-}" in
  install) install ;;
  *) echo "usage: $0 install" >&2; exit 2 ;;
esac
