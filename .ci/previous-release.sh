#!/usr/bin/env bash
# Builds the previous release's `sluice` binary (the commit named in
# .ci/PREVIOUS_RELEASE: the last one speaking peer protocol 2) into
# target/previous/sluice, for the rolling-upgrade test. A separate work tree
# but the same target directory: the dependencies both releases share (same
# version, features and profile) are compiled once, not twice (.ci/run runs
# this before its build, so they are ready for it). Cargo keeps the two
# releases' own crates apart (their paths differ); the one file both write,
# target/release/sluice, is put back if it was there.
set -euo pipefail
cd "$(dirname "$0")/.."
commit=$(cat .ci/PREVIOUS_RELEASE)
# A shallow clone lacks the old commit: deepen it first.
if ! git cat-file -e "${commit}^{commit}" 2>/dev/null; then
    git fetch --quiet --unshallow 2>/dev/null || git fetch --quiet origin "$commit" || true
fi
git cat-file -e "${commit}^{commit}" || {
    echo "previous release $commit is not in this clone's history (and could not be fetched)" >&2
    exit 1
}
tree=target/previous-src
rm -rf "$tree"
git worktree prune
git worktree add --detach "$tree" "$commit" >/dev/null
trap 'git worktree remove --force "$tree"' EXIT
mkdir -p target/previous
current=target/release/sluice
if [ -e "$current" ]; then
    cp -p "$current" target/previous/current-sluice
fi
CARGO_TARGET_DIR="$PWD/target" cargo build --release --locked --bin sluice \
    --manifest-path "$tree/Cargo.toml"
cp target/release/sluice target/previous/sluice
if [ -e target/previous/current-sluice ]; then
    mv -f target/previous/current-sluice "$current"
else
    rm -f "$current"
fi
target/previous/sluice --version || true
