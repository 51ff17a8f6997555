#!/usr/bin/env bash
# Run the examples as the README does, against a node started as the README
# starts it (on spare ports), and check what they print: the axum app
# refuses the 11th request of 10/min with a 429 and its headers; the Python
# caller admits 10 of 12. CI runs this; it stops what it started.
#   examples/check.sh   (after cargo build --release --all-targets; needs curl,
#                        grpcio and grpcio-tools)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/sluice
app=target/release/examples/axum_app
grpc=127.0.0.1:18181
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "${tokens:-}"' EXIT

# Its own admin port and token file (the default 127.0.0.1:8082 may still
# be held by the node the previous CI stage stopped).
tokens=$(mktemp -d)
SLUICE_ADMIN__ADDR=127.0.0.1:18182 SLUICE_ADMIN__TOKEN_FILE="$tokens/admin.token" \
    "$bin" serve --grpc-addr "$grpc" --http-addr 127.0.0.1:18180 >/dev/null 2>&1 &
pids+=($!)
# Ready first: a node still joining decides nothing (NOT_READY), and the
# app, failing open, would answer 200 where 429 is expected.
for _ in $(seq 100); do
    curl -sf -o /dev/null 127.0.0.1:18180/readyz && break
    sleep 0.1
done
curl -sf -o /dev/null 127.0.0.1:18180/readyz || { echo "the node did not turn ready"; exit 1; }
SLUICE_ADDR=$grpc APP_ADDR=127.0.0.1:13030 "$app" >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 100); do
    curl -s -o /dev/null localhost:13030/items && break
    sleep 0.1
done

codes=$(for _ in $(seq 11); do curl -s -o /dev/null -w '%{http_code} ' -H 'x-api-key: check' localhost:13030/items; done)
echo "axum example, 11 requests at 10/min: $codes"
[ "$codes" = "200 200 200 200 200 200 200 200 200 200 429 " ]
head=$(curl -si -H 'x-api-key: check' localhost:13030/items)
for want in 'HTTP/1.1 429' 'retry-after: ' 'x-ratelimit-remaining: 0' 'ratelimit-policy: "per_caller";q=10;w=60' '"error":"rate_limited"'; do
    grep -qF "$want" <<<"$head" || { echo "missing: $want"; echo "$head"; exit 1; }
done
echo "axum example: 429 with Retry-After, X-RateLimit-*, RateLimit-Policy/RateLimit"

out=$(python3 examples/python_client.py "$grpc")
echo "$out" | tail -1
grep -q '^10 of 12 admitted$' <<<"$out"
