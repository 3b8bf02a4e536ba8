#!/usr/bin/env bash
# deploy/local/helm.sh install — helm (v3), kubeconform and the schemas to
# validate rendered manifests against, all under $STATE.
#
# helm and kubeconform are built with `go install` from the Go module proxy (no
# release downloads), GOBIN=$STATE/bin. A cold build (empty Go module and build
# caches) takes about 2 minutes on 2 cores, almost all of it helm.
# kubeconform fetches Kubernetes JSON schemas from the internet by default; here
# they come from PyPI instead: the kubernetes-validate wheel ships the strict
# schemas of every recent Kubernetes version, and one version's are unpacked,
# made standalone, to $STATE/kube-schemas (pass it with -schema-location).
# The prometheus-operator kinds (ServiceMonitor, PrometheusRule) are
# validated with the schema validators that npm's
# @kubernetes-models/prometheus-operator compiles from the operator's CRDs,
# installed into $STATE/crd-models (deploy/local/validate-crds.mjs runs them).
# Installer only: prints helm, kubeconform, the schema directory and the
# models directory, one per line; later runs are a no-op. Concurrent runs wait
# for each other (a lock under $STATE/run).
set -euo pipefail
# shellcheck source=deploy/local/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

HELM_VERSION="${FOLDLINE_HELM_VERSION:-v3.22.0}"
KUBECONFORM_VERSION="${FOLDLINE_KUBECONFORM_VERSION:-v0.8.0}"
KUBE_VERSION="${FOLDLINE_KUBE_VERSION:-1.31.0}"                      # the schemas validated against
KUBERNETES_VALIDATE_VERSION="${FOLDLINE_KUBERNETES_VALIDATE_VERSION:-1.37.0}"
CRD_MODELS_VERSION="${FOLDLINE_CRD_MODELS_VERSION:-6.0.0}"           # @kubernetes-models/prometheus-operator
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

# kube_schemas: $STATE/kube-schemas/v$KUBE_VERSION-standalone-strict/*.json, the
# layout of kubeconform's default template. The kubernetes-validate wheel (PyPI)
# ships "local" schemas that $ref a shared _definitions.json by an absolute path
# kubeconform cannot resolve; each kind's schema is made standalone here by
# copying the definitions it reaches into its own $defs (about 11 MB, < 1 s).
# Use: kubeconform -kubernetes-version $KUBE_VERSION -schema-location
#   "$STATE/kube-schemas/{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json"
kube_schemas() {
  local root="$STATE/kube-schemas" want="kubernetes-validate==$KUBERNETES_VALIDATE_VERSION v$KUBE_VERSION"
  local dir="$root/v$KUBE_VERSION-standalone-strict" stamp="$root/.stamp"
  if [[ -f $dir/deployment-apps-v1.json && -f $stamp && $(<"$stamp") == "$want" ]]; then
    return 0
  fi
  ensure_venv
  local tmp; tmp=$(mktemp -d)
  log "pip download kubernetes-validate==$KUBERNETES_VALIDATE_VERSION (Kubernetes JSON schemas)"
  "$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" \
    "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" >>"$LOGS/pip.log" 2>&1 \
    || die "pip download kubernetes-validate failed (see $LOGS/pip.log)"
  rm -rf "$root"
  mkdir -p "$dir"
  "$VENV/bin/python" - "$tmp" "$dir" "v$KUBE_VERSION-local-strict" <<'PY' || die "unpacking the schemas failed"
import copy, json, pathlib, sys, zipfile

tmp, dest, version = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
wheel = next(tmp.glob("kubernetes_validate-*.whl"))
prefix = f"kubernetes_validate/kubernetes-json-schema/{version}/"
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith(prefix) and n.endswith(".json")]
    if not names:
        sys.exit(f"{wheel.name} has no {version} schemas")
    defs = json.loads(z.read(prefix + "_definitions.json"))["$defs"]
    for name in names:
        base = name[len(prefix):]
        if base.startswith("_") or base == "all.json":
            continue
        schema = json.loads(z.read(name))
        reached: dict[str, object] = {}

        def inline(node: object) -> None:
            if isinstance(node, dict):
                for key, value in node.items():
                    if key == "$ref" and isinstance(value, str) and "#/$defs/" in value:
                        target = value.split("#/$defs/", 1)[1]
                        node[key] = "#/$defs/" + target
                        if target not in reached:
                            reached[target] = copy.deepcopy(defs[target])
                            inline(reached[target])
                    else:
                        inline(value)
            elif isinstance(node, list):
                for item in node:
                    inline(item)

        inline(schema)
        if reached:
            schema["$defs"] = {**schema.get("$defs", {}), **reached}
        (dest / base).write_text(json.dumps(schema, separators=(",", ":")))
PY
  rm -rf "$tmp"
  echo "$want" >"$stamp"
}

# crd_models: npm's @kubernetes-models/prometheus-operator into $STATE/crd-models.
crd_models() {
  local dir="$STATE/crd-models" want="@kubernetes-models/prometheus-operator@$CRD_MODELS_VERSION"
  local stamp="$dir/.stamp"
  if [[ -f $stamp && $(<"$stamp") == "$want" && -d $dir/node_modules/@kubernetes-models/prometheus-operator ]]; then
    return 0
  fi
  command -v npm >/dev/null || die "npm is not installed (needed for the prometheus-operator CRD validators)"
  mkdir -p "$dir"
  log "npm install $want into $dir"
  npm install --prefix "$dir" --no-audit --no-fund --silent "$want" >>"$LOGS/npm.log" 2>&1 \
    || die "npm install $want failed (see $LOGS/npm.log)"
  echo "$want" >"$stamp"
}

install() {
  go_tool helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" helm.sh/helm/v3/internal/version.version
  go_tool kubeconform github.com/yannh/kubeconform/cmd/kubeconform "$KUBECONFORM_VERSION" main.version
  kube_schemas
  crd_models
  echo "$BIN/helm"
  echo "$BIN/kubeconform"
  echo "$STATE/kube-schemas"
  echo "$STATE/crd-models"
}

case "${1:-}" in
  # one install at a time: `make test` starts one in the background, and the tests' own call waits for it
  install) take_lock helm-tools 7 900; install ;;
  *) echo "usage: $0 install" >&2; exit 2 ;;
esac
