#!/usr/bin/env bash
# Second command: install what is missing, build, and run the whole test
# suite (lit in its round-trip leg, GoogleTest, the Python suite, lints, docs
# and format checks) through ctest. The plain lit leg (moe-lit) is left out:
# moe-lit-roundtrip runs the same tests, each moe-opt call also re-parsing its
# output (ctest -R '^moe-lit$' runs it alone).
set -euo pipefail
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
build=${MOE_BUILD_DIR:-$root/build}

"$root/scripts/install-deps.sh"
# The ptxas gate on every generated kernel needs a ptxas; without a CUDA
# toolkit, take the one NVIDIA publishes on PyPI (scripts/fetch-ptxas.py).
if ! command -v ptxas >/dev/null && [ ! -x /usr/local/cuda/bin/ptxas ]; then
  ptxas=$(python3 "$root/scripts/fetch-ptxas.py") ||
    { echo "test.sh: could not fetch ptxas" >&2; exit 1; }
  PATH="$(dirname "$ptxas"):$PATH"
  export PATH
fi
"$root/scripts/build.sh"
cd "$build"
ctest --output-on-failure -j "$(nproc)" -E '^moe-lit$'
