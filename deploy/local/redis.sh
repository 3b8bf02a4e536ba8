#!/usr/bin/env bash
# deploy/local/redis.sh {install|start|stop|status|verify} — local Redis server.
#
# Debian's redis-server package (apt-get; `apt-get update` only when the
# package is not installable from the current lists). Runs daemonized on
# 127.0.0.1:${FOLDLINE_REDIS_PORT:-16379} without persistence (save "",
# appendonly no); working dir $STATE/redis, pid file $STATE/run/redis.pid,
# log $STATE/logs/redis.log.
set -euo pipefail
# shellcheck source=deploy/local/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

NAME=redis
PORT="${FOLDLINE_REDIS_PORT:-16379}"
DATA="$STATE/redis"
PROC_MATCH="redis-server 127.0.0.1:$PORT"

install() {
  if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
    return 0
  fi
  apt_install redis-server redis-tools
}

cli() { redis-cli -h 127.0.0.1 -p "$PORT" "$@"; }
healthy() { [[ $(cli ping 2>/dev/null) == PONG ]]; }

start() {
  install
  if is_running "$NAME" && healthy; then
    log "redis already running (pid $(read_pid $NAME)) on 127.0.0.1:$PORT"
    return 0
  fi
  stop_pid "$NAME"
  port_open 127.0.0.1 "$PORT" && die "port $PORT is taken by another process"
  mkdir -p "$DATA"
  local t0; t0=$(now_ms)
  redis-server --bind 127.0.0.1 --port "$PORT" --protected-mode yes \
    --save "" --appendonly no \
    --daemonize yes --pidfile "$(pidfile $NAME)" \
    --dir "$DATA" --logfile "$(logfile $NAME)" \
    --databases 16 --loglevel notice 8>&- 9>&-
  wait_until 15 healthy || { tail -n 20 "$(logfile $NAME)" >&2; die "redis did not answer PING"; }
  log "redis up on 127.0.0.1:$PORT in $(( $(now_ms) - t0 )) ms ($(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p'))"
}

stop() {
  if is_running "$NAME"; then
    log "stopping redis (pid $(read_pid $NAME))"
    cli shutdown nosave >/dev/null 2>&1 || true
  fi
  stop_pid "$NAME" 10
  kill_strays "redis-server 127.0.0.1:$PORT"
}

status() {
  if is_running "$NAME" && healthy; then
    echo "redis: running (pid $(read_pid $NAME)) redis://127.0.0.1:$PORT/0"
  elif is_running "$NAME"; then
    echo "redis: process $(read_pid $NAME) alive but not answering PING"; return 1
  else
    echo "redis: stopped"; return 3
  fi
}

verify() {
  local key="foldline:verify:$$"
  [[ $(cli set "$key" hello EX 60) == OK ]] || die "SET failed"
  [[ $(cli get "$key") == hello ]] || die "GET returned the wrong value"
  cli del "$key" >/dev/null
  echo "redis: SET/GET ok (version $(cli info server | tr -d '\r' | sed -n 's/^redis_version://p'))"
}

case "${1:-}" in
  install) take_lock "$NAME"; install ;;
  start) take_lock "$NAME"; start ;;
  stop) take_lock "$NAME"; stop ;;
  status) status ;;
  verify) verify ;;
  *) echo "usage: $0 {install|start|stop|status|verify}" >&2; exit 2 ;;
esac
