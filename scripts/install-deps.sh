#!/usr/bin/env bash
# Installs the Debian 12 packages moe-mlir builds and tests with, when missing.
#   scripts/install-deps.sh [PACKAGE...]    # more packages (fuzz.sh and
#                                           # sanitize.sh: libclang-rt-22-dev)
set -euo pipefail

packages=(
  cmake ninja-build git python3 python3-numpy python3-pytest
  llvm-22-dev llvm-22-tools libmlir-22-dev mlir-22-tools
  clang-22 lld-22 clang-format-22 libgtest-dev
  "$@"
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null |
      grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  sudo=sudo
fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q \
  --no-install-recommends "${missing[@]}"
