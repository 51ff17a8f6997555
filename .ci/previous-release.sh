#!/usr/bin/env bash
# Builds the previous release's `sluice` binary (the commit named in
# .ci/PREVIOUS_RELEASE: the last one speaking peer protocol 2) into
# target/previous/sluice, for the rolling-upgrade test. A separate work tree
# and target directory, so the binary under test is not touched.
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
CARGO_TARGET_DIR="$PWD/target/previous-build" cargo build --release --locked --bin sluice \
    --manifest-path "$tree/Cargo.toml"
mkdir -p target/previous
cp target/previous-build/release/sluice target/previous/sluice
target/previous/sluice --version || true
