# shellcheck shell=bash
# What a folder of prebuilt GPU inputs was built from, for its INPUTS.txt: sourced by
# scripts/inputs/build-*.sh (the LLVM machine), so that
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

# compile_sources COMPILE BUILD ROOT MLIR_DIR LAYERS_DIR LOG OUT LIMIT_MIB: moe-compile each
# MLIR_DIR/NAME.mlir into LAYERS_DIR/NAME (a pass or fail line each, scripts/common.sh), then
# OUT/INPUTS.txt (inputs_stamp, the compiler, the layers) and a fail line when OUT is over
# LIMIT_MIB; the callers (build-dynamic-layers.sh, build-ep-layers.sh) end with `finish`.
compile_sources() {
  local compile=$1 build=$2 root=$3 mlir=$4 layers=$5 log=$6 out=$7 limit_mib=$8
  local src name start total_kib
  for src in "$mlir"/*.mlir; do
    name=$(basename "$src" .mlir)
    start=$(date +%s)
    echo "== $compile $src -o $layers/$name" >>"$log"
    if (cd "$root" && timeout 900 "$compile" "$src" -o "$layers/$name") >>"$log" 2>&1 &&
      [ -s "$layers/$name.o" ] && [ -s "$layers/$name.json" ]; then
      pass "$name ($(($(date +%s) - start)) s, $name.o $(du -k "$layers/$name.o" | cut -f1) KiB)"
    else
      fail "$name: moe-compile failed or wrote no .o/.json (log: $log)"
      tail -5 "$log" | sed 's/^/    /'
    fi
  done
  {
    inputs_stamp "$root" "$build"
    echo "compiler: $compile"
    (cd "$layers" && ls -l)
  } >"$out/INPUTS.txt"
  total_kib=$(du -sk "$out" | cut -f1)
  if [ "$total_kib" -gt $((limit_mib * 1024)) ]; then
    fail "$out holds $((total_kib / 1024)) MiB, over the ${limit_mib} MiB limit"
  else
    echo "$out: $((total_kib / 1024)) MiB of ${limit_mib} MiB"
  fi
}
