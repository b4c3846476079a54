#!/usr/bin/env bash
# First command: install what is missing, build, and run the main job on a
# bundled example (the Mixtral 8x7B layer through moe-training-pipeline).
set -euo pipefail
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
build=${MOE_BUILD_DIR:-$root/build}

"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"

example=${1:-$root/examples/mixtral-8x7b.mlir}
name=$(basename "$example" .mlir)
out="$build/layers"
mkdir -p "$out"
# A cubin needs ptxas; without a CUDA toolkit the kernels are embedded as PTX,
# which the driver compiles when the layer is loaded.
format=isa
if command -v ptxas >/dev/null || [ -x /usr/local/cuda/bin/ptxas ]; then
  format=bin
fi
echo
echo "== moe-compile $(basename "$example") --format=$format -o $out/$name"
"$build/bin/moe-compile" "$example" -o "$out/$name" --format="$format"
ls -l "$out/$name".{o,h,json}
echo
echo "== entry points ($out/$name.h)"
grep -E '^(int|size_t) ' "$out/$name.h"
echo
echo "Link $out/$name.o with libmoe_runtime ($build/lib) into a program or a shared"
echo "library; docs/gpu-path.md and examples/cpp show how."
