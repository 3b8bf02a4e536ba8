#!/usr/bin/env bash
# deploy/console/vendor-assets.sh — (re)fetch the console's third-party browser assets from npm.
#
# The console ships every file a page loads inside the package (no CDN: the pages work offline), so these
# are committed under services/foldline/console/static/vendor/ with their licenses. This script is how they
# got there: `npm pack` of each exact version (npm checks the tarball against the registry's integrity hash),
# then the built, minified files and the license are copied out and MANIFEST lists each file's sha256
# (tests/console/test_assets.py checks the committed files against it). Run it to move to another version:
#
#   bash deploy/console/vendor-assets.sh            # the versions below
#   HTMX=2.0.11 UPLOT=1.6.32 bash deploy/console/vendor-assets.sh
set -euo pipefail

HTMX=${HTMX:-2.0.11}
UPLOT=${UPLOT:-1.6.32}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT="$ROOT/services/foldline/console/static/vendor"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

fetch() {  # fetch NAME VERSION DIR: unpack the package's tarball into $WORK/DIR
  local name=$1 version=$2 dir=$3 tgz
  tgz=$(cd "$WORK" && npm pack --silent "$name@$version")
  mkdir -p "$WORK/$dir"
  tar -xzf "$WORK/$tgz" -C "$WORK/$dir" --strip-components=1
  echo "$name@$version $(cd "$WORK" && npm view "$name@$version" dist.integrity)"
}

mkdir -p "$OUT"
{
  echo "# Third-party browser assets of the console: package@version, npm integrity, then each file's sha256."
  echo "# Written by deploy/console/vendor-assets.sh; do not edit by hand."
  fetch htmx.org "$HTMX" htmx
  fetch uplot "$UPLOT" uplot
} > "$WORK/MANIFEST.head"

cp "$WORK/htmx/dist/htmx.min.js" "$OUT/htmx.min.js"
cp "$WORK/htmx/LICENSE" "$OUT/htmx.LICENSE"
cp "$WORK/uplot/dist/uPlot.iife.min.js" "$OUT/uPlot.iife.min.js"
cp "$WORK/uplot/dist/uPlot.min.css" "$OUT/uPlot.min.css"
cp "$WORK/uplot/LICENSE" "$OUT/uPlot.LICENSE"

{
  cat "$WORK/MANIFEST.head"
  (cd "$OUT" && sha256sum htmx.min.js htmx.LICENSE uPlot.iife.min.js uPlot.min.css uPlot.LICENSE)
} > "$OUT/MANIFEST"
cat "$OUT/MANIFEST"
