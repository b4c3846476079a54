# Helpers shared by the scripts that run on the GPU machine (CUDA 13, CMake, ninja; no LLVM):
# scripts/gpu-runtime-check.sh and scripts/gpu-layer-check.sh. Source it after setting
# `root` (the repository) and `out` (the log folder):
#
#   . "$root/scripts/gpu-common.sh"
#   gpu_summary_init "$out/summary.txt"
#   pass "what"; fail "what"; note "what"; ... finish
#
# Functions: gpu_path_setup, gpu_summary_init, note, pass, fail, finish, gpu_environment FILE,
# gpu_build_runtime BUILD_DIR LOG [cmake args...] [-- ninja targets...].

# nvcc and compute-sanitizer live in the toolkit's bin/.
gpu_path_setup() {
  local dir
  for dir in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer; do
    [ -d "$dir" ] && PATH="$PATH:$dir"
  done
  export PATH
}

passed=0
failed=0
summary=/dev/null

gpu_summary_init() {
  summary=$1
  : >"$summary"
}

note() { echo "$*" | tee -a "$summary"; }
pass() {
  passed=$((passed + 1))
  note "PASS $*"
}
fail() {
  failed=$((failed + 1))
  note "FAIL $*"
}
# The last line: "N passed, M failed"; exits non-zero when anything failed.
finish() {
  note "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}

gpu_environment() {
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
    nvidia-smi 2>&1 || echo "nvidia-smi not available"
    nvcc --version 2>&1 || echo "nvcc not on PATH"
    cmake --version 2>&1 | head -1
    ninja --version 2>&1
    command -v compute-sanitizer || echo "compute-sanitizer not on PATH"
  } >"$1" 2>&1
}

# Configures runtime/ standalone into BUILD_DIR and builds it; output appended to LOG.
# Arguments after LOG go to cmake, up to a "--"; those after it are ninja targets.
gpu_build_runtime() {
  local build=$1 log=$2
  shift 2
  local cmake_args=() targets=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    cmake_args+=("$1")
    shift
  done
  [ $# -gt 0 ] && shift
  targets=("$@")
  cmake -G Ninja -S "$root/runtime" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    "${cmake_args[@]}" >>"$log" 2>&1 || return 1
  ninja -C "$build" "${targets[@]}" >>"$log" 2>&1
}

# ---- steps under a deadline (the caller sets log, deadline and start=$(date +%s))
# Seconds left before the deadline, minus a margin for the summary.
left() { echo $((deadline - ($(date +%s) - start) - 10)); }
# run LIMIT TITLE CMD...: the command's output into the log under a header, at most LIMIT
# seconds (less when the deadline is nearer); returns its status (124: out of time, 125: not
# started for lack of time).
run() {
  local limit=$1 title=$2
  shift 2
  local remaining
  remaining=$(left)
  [ "$remaining" -lt "$limit" ] && limit=$remaining
  {
    echo
    echo "===== $title ($(date -u +%H:%M:%S), limit ${limit} s)"
    echo "\$ $*"
  } >>"$log"
  if [ "$limit" -lt 15 ]; then
    echo "not started: only ${limit} s left before the deadline" >>"$log"
    return 125
  fi
  local t0 rc
  t0=$(date +%s)
  timeout --kill-after=15 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  echo "----- exit $rc after $(($(date +%s) - t0)) s" >>"$log"
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "(time limit of ${limit} s reached)" >>"$log"
  return $rc
}
# The log from line $1 on (a step's own output: `mark=$(lines)` before it).
lines() { wc -l <"$log"; }
since() { tail -n +"$(($1 + 1))" "$log"; }
# The step's "N passed, M failed" line, if it printed one.
tally() { since "$1" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -1; }
why() { # a short reason for a status from run
  case "$1" in
  124 | 137) echo "out of time" ;;
  125) echo "not started: deadline" ;;
  *) echo "exit $1" ;;
  esac
}
