#!/usr/bin/env bash
# deploy/local/down.sh [--purge] — stop every local server that up.sh started
# (Kafka, SeaweedFS, Redis) and kill stray processes of ours (matched by
# paths under $STATE). Idempotent: never fails when nothing runs.
# --purge also deletes the servers' data (not the installed tools).
set -euo pipefail
# shellcheck source=deploy/local/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

purge=""
case "${1:-}" in
  "") ;;
  --purge) purge=1 ;;
  *) echo "usage: $0 [--purge]" >&2; exit 2 ;;
esac

pids=()
for s in kafka s3 redis phoenix; do
  "$LOCAL_DIR/$s.sh" stop &
  pids+=($!)
done
for p in "${pids[@]}"; do
  wait "$p" || log "warning: a stop step failed (continuing)"
done

if [[ -n $purge ]]; then
  log "purging server data under $STATE"
  rm -rf "$STATE/kafka/data" "$STATE/seaweedfs" "$STATE/redis" "$STATE/phoenix"
fi
rm -f "$STATE/env.sh"
log "down: all local servers stopped"
