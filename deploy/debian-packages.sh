#!/usr/bin/env bash
# The Debian packages that the deployment and the tests use, installed when missing:
#   nginx     the load balancer in front of replicas (deploy/nginx/), started by tests/test_replicas.py
#   chromium  the headless browser of the dashboard and documentation tests (driven by Playwright)
# It needs root and apt-get; without them it says what is missing, and the tests that need it are skipped.
set -uo pipefail
missing=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "deploy/debian-packages.sh: not root or no apt-get; install ${missing[*]} to run every test" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; } \
    || echo "deploy/debian-packages.sh: apt-get could not install ${missing[*]}; the tests that need them are skipped" >&2
exit 0
