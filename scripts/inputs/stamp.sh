# shellcheck shell=bash
# What a folder of prebuilt GPU inputs was built from, for its INPUTS.txt: sourced by
# scripts/inputs/build-layers.sh and scripts/inputs/build-torch-cache.sh (the LLVM machine), so that
# both spell the "kernel library:" line that scripts/gpu/torch-check.sh compares alike.
#
#   . "$root/scripts/inputs/stamp.sh"
#   { inputs_stamp "$root" "$build"; ...more lines...; } >"$out/INPUTS.txt"

# Prints: the commit, the files of lib/ include/ tools/ not committed (the kernels come from
# the build's kernel builder, which may be ahead of the commit, and layers built from an
# uncommitted experiment must say so), the kernel library the build holds and the date.
inputs_stamp() {
  local root=$1 build=$2 changed
  echo "commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
  changed=$(git -C "$root" status --porcelain -- lib include tools 2>/dev/null | awk '{print $2}' | tr '\n' ' ')
  echo "uncommitted in lib/ include/ tools/: ${changed:-none}"
  # shellcheck disable=SC2012 # the kernel files' names are hashes
  echo "kernel library: $(ls "$build/share/moe_mlir/kernels" 2>/dev/null | tr '\n' ' ')"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
}
