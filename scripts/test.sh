#!/usr/bin/env bash
# Sets up (scripts/setup.sh), runs the whole test suite, then fuzzes every decoder briefly.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo test --workspace --no-fail-fast -- --test-threads=2
bash scripts/fuzz.sh
