#!/usr/bin/env bash
# The client crate is lean: an app that depends on it builds none of the
# server. Fails on any crate of the list below in its normal dependency
# tree — and when `cargo tree` itself fails.
set -euo pipefail
cd "$(dirname "$0")/.."
server_only=(sluice chitchat dashmap figment notify prometheus-client
    tonic-health tonic-reflection rcgen hdrhistogram clap arc-swap foldhash
    tracing-subscriber serde_yaml_ng toml)
tree=$(cargo tree --locked -p sluice-client -e normal --prefix none --format '{p}')
found=()
for crate in "${server_only[@]}"; do
    if grep -qE "^${crate} v" <<<"$tree"; then
        found+=("$crate")
    fi
done
if ((${#found[@]})); then
    echo "sluice-client pulls in server crates: ${found[*]}" >&2
    exit 1
fi
echo "sluice-client: $(sort -u <<<"$tree" | wc -l) crates, none of: ${server_only[*]}"
# The decision core, which the client is to share with the server (issue
# 23), depends on nothing at all.
core=$(cargo tree --locked -p sluice-core -e normal --prefix none --format '{p}' | sort -u)
if [[ $(wc -l <<<"$core") -ne 1 ]]; then
    echo "sluice-core has dependencies: $(tail -n +2 <<<"$core" | tr '\n' ' ')" >&2
    exit 1
fi
echo "sluice-core: no dependencies"
