#!/usr/bin/env bash
# Render an `lmshards report` page in headless Chromium and save a PNG screenshot, to see
# that the page (and its inline SVG plots) displays in a real browser with no network.
#
# Usage:
#   lmshards report OUT -o report.html
#   scripts/render_report.sh report.html report.png [WIDTH,HEIGHT]     # default 1400,4000
#
# Needs Debian's chromium (`apt-get update && apt-get install -y chromium`: about 50 s and
# 110 MB of packages); CHROMIUM=/path/to/binary picks another Chromium or Chrome.
# tests/pipelines/test_inspect.py runs this script when a Chromium is installed, beside
# scripts/check_report_layout.py (which lists any element that does not fit at 1400 px).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 REPORT.html OUT.png [WIDTH,HEIGHT]" >&2
  exit 2
fi
html=$(realpath "$1")
png=$(realpath -m "$2")
size=${3:-1400,4000}
browser=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)}
if [ -z "$browser" ]; then
  echo "$0: no chromium found (apt-get install -y chromium, or set CHROMIUM)" >&2
  exit 3
fi
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
# No sandbox (containers run as root), no GPU, and nothing that talks to the network.
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --hide-scrollbars --user-data-dir="$profile" --window-size="$size" \
  --screenshot="$png" "file://$html" >/dev/null 2>&1
test -s "$png"
echo "wrote $png"
