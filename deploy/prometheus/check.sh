#!/usr/bin/env bash
# Check the Prometheus rules: their syntax (promtool check rules), then the
# unit tests (promtool test rules: every alert fires on its fault and stays
# quiet on a near miss; the recording rules' values).
#
# Without promtool, install.sh installs Debian's prometheus package, which
# ships it.
set -euo pipefail
cd "$(dirname "$0")"

./install.sh
promtool --version

promtool check rules sluice-rules.yml
promtool test rules sluice-rules.test.yml
