#!/usr/bin/env bash
# Second command: install what is missing, build, and run the whole test
# suite (lit, its round-trip leg, GoogleTest, lints, docs and format checks)
# through ctest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${MOE_BUILD_DIR:-$root/build}

"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
cd "$build"
ctest --output-on-failure -j "$(nproc)"
