#!/usr/bin/env bash
# Debian's chromium for the browser tests (tests/browser/), installed with apt-get when it is missing and
# this runs as root; never `playwright install`, which downloads its own browser from the internet.
# Without it (not root, no apt-get, the install failed) this says so in one line and exits 0, so the tests
# skip; under CI=true a missing browser is a failure instead.
set -u
CHROMIUM=${PARLEY_CHROMIUM:-/usr/bin/chromium}
if [ -x "$CHROMIUM" ]; then
    exit 0
fi
why=""
if [ "$(id -u)" != 0 ]; then
    why="not root"
elif ! command -v apt-get >/dev/null; then
    why="no apt-get"
else
    echo "installing Debian's chromium for the browser tests (apt-get)..."
    export DEBIAN_FRONTEND=noninteractive
    if apt-get install -y --no-install-recommends chromium >/tmp/parley-chromium-apt.log 2>&1 \
        || { apt-get update -qq >>/tmp/parley-chromium-apt.log 2>&1 \
             && apt-get install -y --no-install-recommends chromium >>/tmp/parley-chromium-apt.log 2>&1; }; then
        [ -x "$CHROMIUM" ] && exit 0
        why="apt-get installed chromium but $CHROMIUM is not there"
    else
        why="apt-get install chromium failed (log: /tmp/parley-chromium-apt.log)"
    fi
fi
echo "browser tests will be skipped: $CHROMIUM is missing ($why)"
if [ "${CI:-}" = "true" ]; then
    echo "CI=true: a skipped browser test is a failure" >&2
    exit 1
fi
exit 0
