#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ for a bounded time (FUZZ_SECONDS each, default 10).
# cargo-fuzz wants nightly; this builds the same targets on stable with RUSTC_BOOTSTRAP=1 and
# libFuzzer's coverage flags, and runs them on a scratch copy of the committed seed corpora.
# A crash fails the run and leaves the input under fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-10}
target=$(rustc -vV | sed -n 's/^host: //p')
out=${FUZZ_TARGET_DIR:-target/fuzz}
flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters"
flags="$flags -Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
(cd fuzz && RUSTC_BOOTSTRAP=1 RUSTFLAGS="$flags" cargo build --release --target "$target" --target-dir "../$out" --bins)
mkdir -p fuzz/artifacts
for corpus in fuzz/corpus/*/; do
    name=$(basename "$corpus")
    scratch=$(mktemp -d)
    cp "$corpus"* "$scratch"/
    echo "fuzz: $name for ${seconds}s"
    "$out/$target/release/$name" "$scratch" -max_total_time="$seconds" -artifact_prefix="fuzz/artifacts/$name-" -print_final_stats=1 2>&1 | tail -4
    rm -rf "$scratch"
done
echo "fuzz: every target ran ${seconds}s without a crash"
