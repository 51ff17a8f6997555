#!/usr/bin/env bash
# Run every fuzz target for SECONDS each (default 60) from its seeds and the
# corpus grown so far. A crash stops the run and names the input: copy it
# into fuzz/regressions/<target>/ with the fix, where tests/fuzz_regressions.rs
# replays it on stable.
#
# cargo fuzz needs nightly's -Z flags: the nightly toolchain when installed,
# else the stable compiler with RUSTC_BOOTSTRAP=1 (same flags, no download).
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-60}
targets=(check_request config_text rules_text algorithm)

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked --version 0.13.2
fi
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    fuzz=(cargo +nightly fuzz)
else
    export RUSTC_BOOTSTRAP=1
    fuzz=(cargo fuzz)
fi
# No AddressSanitizer: the code under test is safe Rust; what the fuzzers
# look for is panics and overflow (checked: see Cargo.toml's profile), and
# a build without ASan is minutes faster.
"${fuzz[@]}" build --sanitizer none --release
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    echo "--- fuzz $t for ${seconds}s"
    # The run's own exit status decides (a timeout or a startup error
    # leaves no crash-* file); grep only trims the log.
    set +o errexit
    "${fuzz[@]}" run --sanitizer none --release "$t" "corpus/$t" "seeds/$t" "regressions/$t" -- \
        -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 -print_final_stats=1 2>&1 |
        grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::new_units_added|==|SUMMARY|.*panicked|artifact_prefix|Test unit written)"
    status=("${PIPESTATUS[@]}")
    set -o errexit
    if [ "${status[0]}" -ne 0 ]; then
        echo "FAILED: fuzz $t exited ${status[0]}; artifacts: $(ls "artifacts/$t" 2>/dev/null)" >&2
        exit 1
    fi
    if compgen -G "artifacts/$t/crash-*" >/dev/null || compgen -G "artifacts/$t/oom-*" >/dev/null; then
        echo "FINDING in $t: $(ls artifacts/$t)" >&2
        exit 1
    fi
done
