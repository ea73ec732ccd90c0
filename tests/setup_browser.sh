#!/usr/bin/env bash
# The headless browser of the web console's tests (tests/frontends/console): Debian's chromium,
# driven by Playwright's Python package (the `test` extra) pointed at it, since Playwright's own
# browser builds are downloaded from outside the package registries. Idempotent; $NAIAD_CHROMIUM
# names another Chromium or Chrome binary to use instead.
set -euo pipefail

log() { echo "[setup_browser] $*" >&2; }

if [ -n "${NAIAD_CHROMIUM:-}" ] && [ -x "$NAIAD_CHROMIUM" ]; then exit 0; fi
if command -v chromium >/dev/null 2>&1; then exit 0; fi

SUDO=""
if [ "$(id -u)" != 0 ]; then
    if sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        log "chromium is missing and apt-get needs root: run 'sudo apt-get install chromium' or set NAIAD_CHROMIUM"
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
PACKAGES=(chromium fonts-liberation)
log "apt-get install ${PACKAGES[*]}"
if ! $SUDO apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null 2>&1; then
    $SUDO apt-get update -qq >/dev/null
    $SUDO apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
fi
command -v chromium >/dev/null
