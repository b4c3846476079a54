#!/usr/bin/env bash
# First command: install what is missing, build, and run the main job on a
# bundled example (the Mixtral 8x7B layer through moe-training-pipeline).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${MOE_BUILD_DIR:-$root/build}

"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"

example=${1:-$root/examples/mixtral-8x7b.mlir}
echo
echo "== moe-opt $(basename "$example") --moe-training-pipeline=\"chip=sm_90a\""
"$build/bin/moe-opt" "$example" --moe-training-pipeline="chip=sm_90a"
