#!/usr/bin/env bash
# Build the `sluice:dev` image from this repository, with no base image to
# pull: stage a root filesystem (the release binary and the glibc files it
# loads), then `docker build` FROM scratch. Reuses target/release/sluice when
# it is current (cargo decides), so CI compiles nothing twice.
#   deploy/build-image.sh [tag]
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-sluice:dev}

# The same command as CI's build stage: with --all-targets cargo unifies the
# dev-dependencies' features, so building the binary alone would compile
# much of the tree again with other features.
cargo build --release --locked --all-targets
bin=target/release/sluice

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/rootfs/usr/local/bin" "$stage/rootfs/tmp" "$stage/run"
# The admin token's directory (SLUICE_ADMIN__TOKEN_FILE), the node's own.
chmod 0700 "$stage/run"
cp deploy/Dockerfile "$stage/"
install -m 0755 "$bin" "$stage/rootfs/usr/local/bin/sluice"
# Every shared object the binary loads, at the path it is loaded from.
ldd "$bin" | awk '$3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | while read -r lib; do
    mkdir -p "$stage/rootfs$(dirname "$lib")"
    cp -L "$lib" "$stage/rootfs$lib"
done
chmod 1777 "$stage/rootfs/tmp"

docker build --quiet -t "$tag" "$stage" >/dev/null
size=$(docker image inspect "$tag" --format '{{.Size}}')
echo "built $tag: $((size / 1024 / 1024)) MiB ($size bytes)"
# It runs, as a non-root user.
docker run --rm "$tag" --version
[ "$(docker image inspect "$tag" --format '{{.Config.User}}')" = "65532:65532" ]
