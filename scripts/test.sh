#!/usr/bin/env bash
# Sets up (scripts/setup.sh), runs the whole test suite, then fuzzes every decoder briefly.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# What only the tests use: Debian's ffmpeg, whose OpenCL filters, and OpenCV (python3-opencv),
# whose T-API, run through a driver crash in tests/tests/recovery_replay.rs.
test_packages=(ffmpeg python3-opencv)
missing=()
for p in "${test_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
cargo test --workspace --no-fail-fast -- --test-threads=2
# `cargo install --path broker` and the installed binary alone: a release build of its own
# (minutes), so a step of its own rather than one test among the parallel ones.
cargo test -p cloister-tests --test install -- --ignored --exact cargo_install_gives_a_working_cloister
bash scripts/fuzz.sh
