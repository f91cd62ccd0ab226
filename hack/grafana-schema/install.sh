#!/usr/bin/env bash
# Grafana's own dashboard schema, as Grafana publishes it for code (the npm package @grafana/schema:
# TypeScript types generated from Grafana's schema of the dashboard JSON model, Apache-2.0), and the
# TypeScript compiler that checks a dashboard against it (tests/unit/test_dashboard.py). Installed
# once per pinned versions into the cache every clone shares; prints its directory on stdout,
# everything else goes to stderr.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${TPUTORCH_CACHE:-$HOME/.cache/tputorch}
PACKAGES=(@grafana/schema@13.2.3 typescript@5.9.3)
KEY=$(cat "$HERE/install.sh" | sha256sum | cut -c1-12)
DIR=$CACHE/grafana-schema-$KEY
mkdir -p "$CACHE"
if [ ! -f "$DIR/.installed" ]; then
  exec 9>"$CACHE/.grafana-schema.lock"
  flock 9
fi
if [ ! -f "$DIR/.installed" ]; then
  {
    rm -rf "$DIR"
    mkdir -p "$DIR"
    command -v npm >/dev/null || { echo "grafana-schema: npm (Node.js) is needed: apt-get install npm"; exit 1; }
    npm install --prefix "$DIR" --no-audit --no-fund --no-save --silent "${PACKAGES[@]}"
    touch "$DIR/.installed"
    echo "grafana-schema: ${PACKAGES[*]} in $DIR"
  } >&2
fi
echo "$DIR"
