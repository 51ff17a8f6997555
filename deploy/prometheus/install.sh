#!/usr/bin/env bash
# Make sure `prometheus` and `promtool` are on PATH: without either,
# installs Debian's prometheus package, which ships both (~19 MB; on a host
# run by systemd the package also starts a Prometheus server on :9090, which
# CI's throwaway machines do not mind). Used by check.sh (promtool) and
# tests/prometheus_loop.py (a real Prometheus).
set -euo pipefail

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    else
        sudo "$@"
    fi
}

if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
    exit 0
fi
echo "prometheus or promtool not found: installing Debian's prometheus package"
as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
