#!/usr/bin/env bash
# Installs what cloister needs on Debian 12 and builds it. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

# python3-pyopencl: the install tests' client (tests/tests/install.rs).
packages=(pocl-opencl-icd ocl-icd-opencl-dev ocl-icd-libopencl1 opencl-c-headers clinfo clpeak hashcat gcc pkg-config python3-pyopencl)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
    [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
fi
command -v cargo >/dev/null 2>&1 || { echo "setup: Rust (cargo) is required: https://rustup.rs" >&2; exit 1; }

cargo build --workspace --bins --lib ${CLOISTER_RELEASE:+--release}
