#!/usr/bin/env bash
# deploy/local/phoenix.sh {install|start|stop|status|env} — a local trace backend: Arize Phoenix.
#
# Phoenix (PyPI `arize-phoenix`, pinned) receives OpenTelemetry spans over OTLP — HTTP/protobuf on
# 127.0.0.1:$PHOENIX_PORT/v1/traces and gRPC on 127.0.0.1:$PHOENIX_GRPC_PORT — and answers for them through
# its REST API (GET /v1/projects/{project}/spans). It gets a venv of its own, $STATE/phoenix-venv (about
# 860 MB; ~1 min to install with a warm pip cache), kept apart from the tools venv, and keeps its SQLite
# database under $STATE/phoenix. Its own usage telemetry is off.
# Ports: FOLDLINE_PHOENIX_PORT (default: the Kafka port + 7) and FOLDLINE_PHOENIX_GRPC_PORT (+ 8), so each
# FOLDLINE_LOCAL_DIR with its own ports gets its own Phoenix.
# `env` prints the OTEL_* settings that export to it (source them with eval).
set -euo pipefail
# shellcheck source=deploy/local/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

NAME=phoenix
PHOENIX_SPEC="${FOLDLINE_PHOENIX_SPEC:-arize-phoenix==20.26.1}"
KAFKA_BASE="${FOLDLINE_KAFKA_PORT:-19092}"
PORT="${FOLDLINE_PHOENIX_PORT:-$(( KAFKA_BASE + 7 ))}"
GRPC_PORT="${FOLDLINE_PHOENIX_GRPC_PORT:-$(( KAFKA_BASE + 8 ))}"
PVENV="$STATE/phoenix-venv"
DATA="$STATE/phoenix"
PROC_MATCH="$PVENV/bin/phoenix serve"

install() {
  local stamp="$PVENV/.foldline-stamp"
  if [[ -x $PVENV/bin/phoenix && -f $stamp && $(<"$stamp") == "$PHOENIX_SPEC" ]]; then
    return 0
  fi
  local py
  py=$(command -v python3.11 || command -v python3) || die "no python3 found"
  local t0; t0=$(now_ms)
  [[ -x $PVENV/bin/python ]] || "$py" -m venv "$PVENV"
  log "pip install $PHOENIX_SPEC into $PVENV"
  "$PVENV/bin/python" -m pip install -q --disable-pip-version-check "$PHOENIX_SPEC" >>"$LOGS/phoenix-pip.log" 2>&1 \
    || die "pip install $PHOENIX_SPEC failed (see $LOGS/phoenix-pip.log)"
  echo "$PHOENIX_SPEC" >"$stamp"
  log "phoenix installed in $(( ($(now_ms) - t0) / 1000 )) s"
}

healthy() { [[ $(curl -fsS --max-time 2 "http://127.0.0.1:$PORT/healthz" 2>/dev/null) == OK* ]]; }

start() {
  ( take_lock phoenix-install 7 900; install )  # in a subshell: the server must not inherit the lock
  if is_running "$NAME" && healthy; then
    log "phoenix already running (pid $(read_pid $NAME)) on 127.0.0.1:$PORT"
    return 0
  fi
  stop_pid "$NAME"
  port_open 127.0.0.1 "$PORT" && die "port $PORT is taken by another process"
  port_open 127.0.0.1 "$GRPC_PORT" && die "port $GRPC_PORT is taken by another process"
  mkdir -p "$DATA"
  local t0; t0=$(now_ms)
  PHOENIX_WORKING_DIR="$DATA" PHOENIX_HOST=127.0.0.1 PHOENIX_PORT="$PORT" PHOENIX_GRPC_PORT="$GRPC_PORT" \
    PHOENIX_TELEMETRY_ENABLED=false DO_NOT_TRACK=1 start_bg "$NAME" "$PVENV/bin/phoenix" serve
  wait_until "${FOLDLINE_PHOENIX_START_TIMEOUT:-120}" healthy \
    || { tail -n 30 "$(logfile $NAME)" >&2; die "phoenix did not answer /healthz"; }
  log "phoenix up on 127.0.0.1:$PORT (OTLP gRPC $GRPC_PORT) in $(( $(now_ms) - t0 )) ms"
}

stop() {
  stop_pid "$NAME" 15
  kill_strays "$PROC_MATCH"
}

status() {
  if is_running "$NAME" && healthy; then
    echo "phoenix: running (pid $(read_pid $NAME)) http://127.0.0.1:$PORT"
  else
    echo "phoenix: stopped"; return 3
  fi
}

env_lines() {
  echo "export FOLDLINE_LOCAL_PHOENIX_URL=http://127.0.0.1:$PORT"
  echo "export FOLDLINE_LOCAL_PHOENIX_GRPC=http://127.0.0.1:$GRPC_PORT"
}

case "${1:-}" in
  # one install at a time: `make test` starts one in the background, and the tests' own call waits for it
  install) take_lock phoenix-install 7 900; install ;;
  start) take_lock "$NAME"; start ;;
  stop) take_lock "$NAME"; stop ;;
  status) status ;;
  env) env_lines ;;
  *) echo "usage: $0 {install|start|stop|status|env}" >&2; exit 2 ;;
esac
