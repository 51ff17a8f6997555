#!/usr/bin/env bash
# Check the Prometheus rules: their syntax (promtool check rules), then the
# unit tests (promtool test rules: every alert fires on its fault and stays
# quiet on a near miss; the recording rules' values).
#
# Without promtool, installs Debian's prometheus package, which ships it
# (~19 MB; on a host run by systemd the package also starts a Prometheus
# server, which CI's throwaway machines do not mind).
set -euo pipefail
cd "$(dirname "$0")"

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    else
        sudo "$@"
    fi
}

if ! command -v promtool >/dev/null; then
    echo "promtool not found: installing Debian's prometheus package"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
promtool --version

promtool check rules sluice-rules.yml
promtool test rules sluice-rules.test.yml
