#!/usr/bin/env bash
# Headless Chromium for the browser tests: Debian's package (Playwright drives it through
# executable_path; `playwright install` is never used). Needs root or passwordless sudo.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
