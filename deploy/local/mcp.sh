#!/usr/bin/env bash
# deploy/local/mcp.sh install — install the reference MCP server the tests and the demo run;
# prints the path of its entry script (run it as `node <path> stdio` or `PORT=N node <path> streamableHttp`).
#
# The server is @modelcontextprotocol/server-everything from the npm registry, at a pinned version,
# installed with the machine's npm into $STATE/mcp (Node.js 20 or later on PATH: apt-get install nodejs npm).
# Idempotent: an installed copy of the pinned version is reused. The other MCP servers the tests use are
# written with the mcp SDK (tests/mcp_servers/) and need only the Python environment.
set -euo pipefail
# shellcheck source=deploy/local/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SERVER_EVERYTHING_VERSION="${SERVER_EVERYTHING_VERSION:-2026.8.31}"
PREFIX="$STATE/mcp"
ENTRY="$PREFIX/node_modules/@modelcontextprotocol/server-everything/dist/index.js"

install() {
  command -v node >/dev/null || die "node is not on PATH (Node.js 20 or later; apt-get install nodejs npm)"
  command -v npm >/dev/null || die "npm is not on PATH (apt-get install npm)"
  local major; major=$(node -p 'process.versions.node.split(".")[0]')
  (( major >= 20 )) || die "server-everything needs Node.js 20 or later; this node is $(node --version)"
  take_lock mcp-install 7 600
  local stamp="$PREFIX/.installed"
  if [[ -f $ENTRY && -f $stamp && $(<"$stamp") == "$SERVER_EVERYTHING_VERSION" ]]; then
    echo "$ENTRY"
    return 0
  fi
  mkdir -p "$PREFIX"
  log "installing @modelcontextprotocol/server-everything@$SERVER_EVERYTHING_VERSION into $PREFIX"
  [[ -f $PREFIX/package.json ]] || echo '{"name": "foldline-local-mcp", "private": true}' >"$PREFIX/package.json"
  npm install --prefix "$PREFIX" --no-audit --no-fund --save-exact --loglevel=error \
    "@modelcontextprotocol/server-everything@$SERVER_EVERYTHING_VERSION" >>"$LOGS/mcp-install.log" 2>&1 \
    || die "npm install failed (log: $LOGS/mcp-install.log)"
  [[ -f $ENTRY ]] || die "server-everything installed, but $ENTRY is missing"
  echo "$SERVER_EVERYTHING_VERSION" >"$stamp"
  echo "$ENTRY"
}

case "${1:-}" in
  install) install ;;
  *) echo "usage: $0 install" >&2; exit 2 ;;
esac
