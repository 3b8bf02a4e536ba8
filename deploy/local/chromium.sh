#!/usr/bin/env bash
# deploy/local/chromium.sh install — headless Chromium and its WebDriver for the console's browser tests;
# prints the driver's path.
#
# Both come from Debian's packages (`chromium`, `chromium-driver`), installed with apt-get; nothing
# downloads a browser build of its own. The tests drive the browser through Selenium pointed at
# /usr/bin/chromedriver (tests/console/browser.py).
set -euo pipefail
# shellcheck source=deploy/local/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

install() {
  { command -v chromium && command -v chromedriver; } >/dev/null 2>&1 || apt_install chromium chromium-driver
  local driver; driver=$(command -v chromedriver) || die "chromedriver not found after installing chromium-driver"
  command -v chromium >/dev/null || die "chromium not found after installing it"
  echo "$driver"
}

case "${1:-}" in
  install) take_lock chromium-tools 7 900; install ;;  # make test's prefetch and the xdist workers wait for each other
  *) echo "usage: $0 install" >&2; exit 2 ;;
esac
