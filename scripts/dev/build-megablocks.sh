#!/usr/bin/env bash
# Builds MegaBlocks (bench/megablocks.py's peer) from the source packages that
# scripts/dev/fetch-peer-wheels.sh megablocks put in .whl/megablocks/, into SITE (a folder for
# PYTHONPATH), with the Python, torch and nvcc at hand: on the GPU machine (scripts/gpu/session.sh
# megablocks), or here to check that it builds (no GPU needed: TORCH_CUDA_ARCH_LIST says the
# target). Each package goes through
#   pip install --no-index --no-build-isolation --no-deps --target SITE DIR
# so that the torch at hand builds it: megablocks pins torch 2.7.0 (build and run) and
# grouped_gemm torch < 2.8, which --no-build-isolation and --no-deps leave unenforced.
#   stanford-stk 0.7.1  pure Python + Triton (megablocks' block-sparse matmuls, mlp_impl
#                       'sparse'); patched: its Triton kernels load the int16 block indices
#                       and compute offsets in int16, which overflows since Triton 3.2 (the
#                       reason megablocks 0.10.0 refuses 'sparse' with Triton >= 3.2); each
#                       such load is cast to int32.
#   grouped_gemm 0.3.0  CUDA extension (grouped_gemm_backend; cuBLAS GEMM a group, its default
#                       build: mlp_impl 'grouped').
#   megablocks 0.10.0   CUDA extension (megablocks_ops: cub sort, histogram, cumsum);
#                       patched: csrc/cumsum.h passes cub::DeviceScan a debug_synchronous
#                       argument that CUDA 13's CCCL 3 no longer has (6 compile errors).
# setuptools (< 79) and ninja come from .whl/megablocks too, into a tools folder, for a Python
# that lacks them. Then the imports, and scripts/dev/megablocks_triton_check.py: the Triton
# kernels compiled for sm_90, none with int16 offsets left.
#   bash scripts/dev/build-megablocks.sh SITE
# Environment: PYTHON (default python3), TORCH_CUDA_ARCH_LIST (default 9.0), MAX_JOBS (default
# the cores), MOE_MEGABLOCKS_BUILD_LIMIT (seconds a package, default 420), CUDA_HOME (default
# /usr/local/cuda). Logs in SITE/../megablocks-build/ (or $OUT when set). Last line
# "N passed, M failed".
set -u -o pipefail
# shellcheck source=../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
case "${1:-}" in -h | --help) usage ;; "") die "no SITE folder (see --help)" ;; esac
site=$(mkdir -p "$1" && cd "$1" && pwd) || die "cannot make $1"
py=${PYTHON:-python3}
src=$root/.whl/megablocks
limit=${MOE_MEGABLOCKS_BUILD_LIMIT:-420}
logs=${OUT:-$(dirname "$site")/megablocks-build}
mkdir -p "$logs"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0
pass() { echo "PASS $*"; passed=$((passed + 1)); }
fail() { echo "FAIL $*"; failed=$((failed + 1)); }

export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH=$CUDA_HOME/bin:$PATH
for f in megablocks-0.10.0.tar.gz stanford_stk-0.7.1.tar.gz grouped_gemm-0.3.0.tar.gz; do
  [ -f "$src/$f" ] || die "$src/$f missing: bash scripts/dev/fetch-peer-wheels.sh megablocks (and carry .whl/megablocks)"
  tar -xzf "$src/$f" -C "$work" || die "cannot unpack $f"
done

# Build tools the Python may lack (a Python 3.12 venv has no setuptools).
tools=$work/tools
if ! "$py" -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) >= 79)' 2>/dev/null ||
  ! command -v ninja >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --target "$tools" "$src"/setuptools-*.whl "$src"/ninja-*.whl ||
    die "cannot install setuptools and ninja from $src"
  export PYTHONPATH=$tools${PYTHONPATH:+:$PYTHONPATH}
  export PATH=$tools/bin:$PATH
fi
{
  echo "python: $("$py" -c 'import sys; print(sys.version.split()[0])')"
  "$py" -c 'import torch, triton, setuptools; print("torch", torch.__version__, "cuda", torch.version.cuda,
"triton", triton.__version__, "setuptools", setuptools.__version__)'
  nvcc --version | tail -1
  echo "ninja $(ninja --version 2>&1)"
  echo "TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS"
} 2>&1 | tee "$logs/versions.txt"

# The patches: each must change what it names, or the package differs from the one read.
"$py" - "$work" <<'EOF' || die "patching failed (the sources differ from those read)"
import re, sys
work = sys.argv[1]

def patch(path, pattern, repl, count):
    with open(path) as f:
        text = f.read()
    text, n = re.subn(pattern, repl, text)
    if n != count:
        sys.exit(f"{path}: {n} matches of {pattern!r}, expected {count}")
    with open(path, "w") as f:
        f.write(text)
    print(f"patched {path}: {n} places")

# CCCL 3 (CUDA 13): cub::DeviceScan::{Ex,In}clusiveSum have no debug_synchronous argument
patch(f"{work}/megablocks-0.10.0/csrc/cumsum.h", r"stream,\s*debug_synchronous\)\);", "stream));", 2)
# Triton >= 3.2 keeps int16 * int in int16: the block indices' offsets overflow past 32767
patch(
    f"{work}/stanford_stk-0.7.1/stk/backend/triton_kernels.py",
    r"tl\.load\(((?:row_indices|column_indices|offsets|block_offsets_t)[^()]*)\)",
    r"tl.load(\1).to(tl.int32)",
    12,
)
EOF

build() { # build NAME DIR: pip install DIR into SITE within the limit; NAME.status says how
  local name=$1 dir=$2 t0 rc
  t0=$(date +%s)
  timeout -k 10 "$limit" "$py" -m pip install -v --no-index --no-build-isolation --no-deps \
    --no-cache-dir --upgrade --target "$site" "$dir" >"$logs/build-$name.log" 2>&1
  rc=$?
  echo "$rc $(($(date +%s) - t0))" >"$logs/build-$name.status"
}
tally() { # tally NAME: PASS or FAIL by build's status
  local rc secs
  read -r rc secs <"$logs/build-$1.status"
  if [ "$rc" = 0 ]; then
    pass "$1 built ($secs s)"
  else
    fail "$1: exit $rc after $secs s (log: $logs/build-$1.log)"
    grep -m 5 -E "error|Error" "$logs/build-$1.log" | cut -c1-300 | sed 's/^/    /'
  fi
}
# The two CUDA extensions (three .cu files) at once where there are cores for both; pip
# --target replaces only each package's own folders in SITE.
build stanford-stk "$work/stanford_stk-0.7.1"
tally stanford-stk
if [ "$(nproc)" -ge 6 ]; then
  build grouped_gemm "$work/grouped_gemm-0.3.0" &
  build megablocks "$work/megablocks-0.10.0" &
  wait
else
  build grouped_gemm "$work/grouped_gemm-0.3.0"
  build megablocks "$work/megablocks-0.10.0"
fi
tally grouped_gemm
tally megablocks

# torch first: the extensions link libc10 by name
if PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} "$py" -c '
import torch, megablocks_ops, grouped_gemm, stk
from megablocks.layers import dmoe, arguments
from megablocks import grouped_gemm_util as gg
assert gg.grouped_gemm_is_available(), "grouped_gemm does not import"
from megablocks._version import __version__
print("imports ok: megablocks", __version__)
' >"$logs/import.log" 2>&1; then
  pass "$(tail -1 "$logs/import.log")"
else
  fail "import (log: $logs/import.log)"
  tail -5 "$logs/import.log" | sed 's/^/    /'
fi
# MegaBlocks' and stk's Triton kernels compiled for sm_90 (no GPU needed), no int16 offsets left
if PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} "$py" "$root/scripts/dev/megablocks_triton_check.py" \
  >"$logs/triton-check.log" 2>&1; then
  pass "Triton kernels: $(tail -1 "$logs/triton-check.log")"
else
  fail "Triton kernels (log: $logs/triton-check.log)"
  grep -E "^FAIL" "$logs/triton-check.log" | cut -c1-300 | sed 's/^/    /'
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
