#!/usr/bin/env bash
# Run every fuzz target for the given seconds each (default 30), on the stable
# toolchain (RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass libFuzzer's flags). Installs
# cargo-fuzz when missing. Prints the executions of each target and fails on any crash,
# panic, timeout or out-of-memory; the input that caused it is kept under the output
# folder's artifacts/ and printed.
#
#   fuzz/run.sh          30 s per target (CI)
#   fuzz/run.sh 600      10 minutes per target
#   FUZZ_TARGETS="cron config" fuzz/run.sh 60
#   FUZZ_BUILD_ONLY=1 fuzz/run.sh   build the targets, run none (CI builds before testing)
#
# The committed seed corpus (fuzz/corpus/<target>) is read, never written: new inputs
# go to a scratch corpus next to the build, outside the clone when CARGO_TARGET_DIR is set.
set -euo pipefail
cd "$(dirname "$0")"

seconds=${1:-30}
export RUSTC_BOOTSTRAP=1
out=${CARGO_TARGET_DIR:+$CARGO_TARGET_DIR/fuzz}
out=${out:-$PWD/target}
mkdir -p "$out"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

targets=${FUZZ_TARGETS:-$(cargo fuzz list)}
# No sanitizer: the code under test forbids `unsafe`; overflow checks and debug
# assertions stay on (-a), so an arithmetic overflow is a finding.
build=(--sanitizer none --debug-assertions --target-dir "$out/build")

echo "== fuzz build"
start=$(date +%s)
cargo fuzz build "${build[@]}"
echo "fuzz build: $(( $(date +%s) - start )) s"
if [ -n "${FUZZ_BUILD_ONLY:-}" ]; then exit 0; fi

failed=0
summary=()
for target in $targets; do
    scratch="$out/corpus/$target"
    artifacts="$out/artifacts/$target"
    mkdir -p "$scratch" "$artifacts" "corpus/$target"
    log="$out/$target.log"
    echo "== fuzz $target (${seconds} s)"
    status=0
    cargo fuzz run "${build[@]}" "$target" "$scratch" "corpus/$target" -- \
        -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=512 -timeout=2 \
        -artifact_prefix="$artifacts/" >"$log" 2>&1 || status=$?
    execs=$(awk '/stat::number_of_executed_units/ { n = $NF } END { print n + 0 }' "$log")
    crashes=$(find "$artifacts" -type f | wc -l)
    if [ "$status" -ne 0 ] || [ "$crashes" -ne 0 ]; then
        failed=1
        echo "fuzz $target: FAILED (exit $status, $crashes artifacts in $artifacts)"
        grep -E "panicked at|ERROR: libFuzzer|SUMMARY|Test unit written" "$log" | head -20 || true
    fi
    summary+=("$(printf 'fuzz %-20s %12s executions  %s crashes' "$target" "$execs" "$crashes")")
done

echo "== fuzz summary (${seconds} s per target)"
printf '%s\n' "${summary[@]}"
if [ "$failed" -ne 0 ]; then
    echo "fuzz: crashes found" >&2
    exit 1
fi
echo "fuzz: 0 crashes"
