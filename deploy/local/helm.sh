#!/usr/bin/env bash
# deploy/local/helm.sh install — helm (v3) and kubeconform into $STATE/bin.
#
# Both are built with `go install` from the Go module proxy (no release
# downloads), GOBIN=$STATE/bin. Installer only: prints the two binary paths.
# A cold build (empty Go module and build caches) takes about 2 minutes on
# 2 cores, almost all of it helm; later runs are a no-op.
# Note: kubeconform fetches Kubernetes JSON schemas from the internet by
# default; offline it needs -schema-location pointing at local schema files.
set -euo pipefail
# shellcheck source=deploy/local/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

HELM_VERSION="${FOLDLINE_HELM_VERSION:-v3.22.0}"
KUBECONFORM_VERSION="${FOLDLINE_KUBECONFORM_VERSION:-v0.8.0}"
BIN="$STATE/bin"

# go_tool NAME PACKAGE VERSION VERSION_VAR: go install unless $BIN/NAME is that
# version; VERSION_VAR is the Go variable the project's release build stamps.
go_tool() {
  local name=$1 pkg=$2 ver=$3 version_var=$4 stamp="$BIN/.$1.version"
  if [[ -x $BIN/$name && -f $stamp && $(<"$stamp") == "$ver" ]]; then
    return 0
  fi
  command -v go >/dev/null || die "go is not installed (the Go toolchain is needed to build $name)"
  mkdir -p "$BIN"
  local t0; t0=$(now_ms)
  log "go install $pkg@$ver (GOBIN=$BIN)"
  # Only the module proxy: never fall back to fetching sources directly.
  GOBIN="$BIN" GOPROXY="$(go env GOPROXY | sed 's/,direct$//')" CGO_ENABLED=0 \
    go install -trimpath -ldflags="-s -w -X $version_var=$ver" "$pkg@$ver" >>"$LOGS/go-install.log" 2>&1 \
    || die "go install $pkg@$ver failed (see $LOGS/go-install.log)"
  echo "$ver" >"$stamp"
  log "$name $ver built in $(( ($(now_ms) - t0) / 1000 )) s"
}

install() {
  go_tool helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" helm.sh/helm/v3/internal/version.version
  go_tool kubeconform github.com/yannh/kubeconform/cmd/kubeconform "$KUBECONFORM_VERSION" main.version
  echo "$BIN/helm"
  echo "$BIN/kubeconform"
}

case "${1:-}" in
  install) install ;;
  *) echo "usage: $0 install" >&2; exit 2 ;;
esac
