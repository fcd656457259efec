#!/usr/bin/env bash
# Sets up (scripts/setup.sh), runs the whole test suite, then fuzzes every decoder briefly.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo test --workspace --no-fail-fast -- --test-threads=2
# `cargo install --path broker` and the installed binary alone: a release build of its own
# (minutes), so a step of its own rather than one test among the parallel ones.
cargo test -p cloister-tests --test install -- --ignored --exact cargo_install_gives_a_working_cloister
bash scripts/fuzz.sh
