#!/usr/bin/env sh
# Headless Chromium for tests/integration/test_report_render.py, which draws the sweep report in a
# real browser. Nothing to do when a Chromium or Chrome is on PATH; otherwise Debian's package
# (apt reaches only the distribution's mirror, no browser download from elsewhere).
set -eu
for browser in chromium chromium-browser google-chrome; do
  if command -v "$browser" >/dev/null 2>&1; then exit 0; fi
done
if ! command -v apt-get >/dev/null 2>&1; then
  echo "tests/install-chromium.sh: no chromium on PATH and no apt-get here: install Chromium or Chrome yourself" >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null
command -v chromium >/dev/null
