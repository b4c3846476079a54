# shellcheck shell=bash
# The opening that the project's scripts share: where the repository is, options, a deadline
# over the whole run, a pass/fail tally, and the GPU machine's set-up. Source it first:
#
#   . "$(dirname "${BASH_SOURCE[0]}")/common.sh"      # a script in scripts/
#   . "$(dirname "${BASH_SOURCE[0]}")/../common.sh"   # a script in scripts/gpu, inputs or dev
#
# Sets `root` (the repository), `me` (the script's name, for messages), and for the GPU checks
# `gpu_inputs` ($MOE_GPU_INPUTS, default gpu-inputs/) and `python` ($PYTHON, default python3).
# Functions:
#   usage                      the script's header comment (for -h/--help), then exit 0
#   die MESSAGE...             "me: MESSAGE" on stderr, then exit 2
#   parse_options SPEC... -- ARG...  options into variables (`--name=VAR[=DEFAULT]`,
#                              `--flag:VAR=VALUE`);
#                              the other words into `positional`, those after `--` into `rest`
#   no_positional              exit 2 when there were words that are not options
#   check_steps LIST STEP...   exit 2 unless each step of the comma-separated LIST is a STEP
#   wants STEP                 whether the comma-separated `only` names STEP
#   deadline_start SECONDS     the deadline counts from now; seconds_left tells what remains
#   summary_init FILE; note, pass, fail MESSAGE...; finish (the "N passed, M failed" line)
#   run LIMIT TITLE CMD...     CMD's output into $log under a header, within LIMIT seconds and
#                              the deadline; lines, since, tally and why read what it left,
#                              verdict passes or fails the step by its tally
#   gpu_path_setup; gpu_environment FILE; gpu_build_runtime BUILD_DIR LOG [cmake args] [-- targets]
#   gpu_check_start LOG        the opening of a GPU check: tools on PATH, $out/summary.txt, and
#                              $out/LOG (log) begun with the machine, toolchain and Python's

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
me=$(basename "${BASH_SOURCE[-1]}")

usage() {
  awk 'NR == 1 { next } /^# shellcheck/ { exit } /^#/ { sub(/^# ?/, ""); print; next } { exit }' \
    "${BASH_SOURCE[-1]}"
  exit 0
}

die() {
  echo "$me: $*" >&2
  exit 2
}

# parse_options SPEC... -- ARG...: ARG... by SPEC, where `--name=VAR[=DEFAULT]` takes a value
# (`--name V` or `--name=V`) into VAR (DEFAULT, or empty, when not given) and
# `--name:VAR=VALUE` is a flag that sets VAR to VALUE (empty when not given). -h and --help
# print the header; another word starting with - is an error. The other words go to
# `positional`, those after a `--` among ARG... to `rest`.
parse_options() {
  local specs=() spec name target arg
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    # the variable's value before ARG...: DEFAULT, or empty
    name=${1%%[=:]*}
    target=${1:${#name}+1}
    if [ "${1:${#name}:1}" = "=" ] && [[ $target == *=* ]]; then
      printf -v "${target%%=*}" '%s' "${target#*=}"
    else
      printf -v "${target%%=*}" '%s' ""
    fi
    specs+=("$1")
    shift
  done
  shift
  positional=()
  rest=()
  while [ $# -gt 0 ]; do
    arg=$1
    shift
    case "$arg" in
    -h | --help) usage ;;
    --)
      rest=("$@")
      return
      ;;
    esac
    for spec in "${specs[@]}"; do
      name=${spec%%[=:]*}
      target=${spec:${#name}+1}
      if [ "${spec:${#name}:1}" = ":" ]; then
        [ "$arg" = "$name" ] || continue
        printf -v "${target%%=*}" '%s' "${target#*=}"
      elif [ "$arg" = "$name" ]; then
        [ $# -gt 0 ] || die "$name needs a value (see --help)"
        printf -v "${target%%=*}" '%s' "$1"
        shift
      elif [[ $arg == "$name="* ]]; then
        printf -v "${target%%=*}" '%s' "${arg#"$name"=}"
      else
        continue
      fi
      continue 2
    done
    case "$arg" in -*) die "unknown option $arg (see --help)" ;; esac
    positional+=("$arg")
  done
}

# no_positional: exits 2 when parse_options left words that are not options.
no_positional() {
  [ ${#positional[@]} -eq 0 ] || die "unexpected argument ${positional[0]} (see --help)"
}

check_steps() {
  local list=$1 step known
  shift
  for step in ${list//,/ }; do
    for known in "$@"; do
      [ "$step" = "$known" ] && continue 2
    done
    die "unknown step '$step' ($(
      IFS=,
      echo "$*"
    ))"
  done
}

# shellcheck disable=SC2154 # only is the caller's
wants() { [[ ",$only," == *",$1,"* ]]; }

# ---- a deadline over the whole script
deadline=${deadline:-600}
start=$(date +%s)
deadline_start() {
  deadline=$1
  start=$(date +%s)
}
seconds_left() { echo $((deadline - ($(date +%s) - start))); }

# ---- a tally of checks, "N passed, M failed" last
passed=0
failed=0
summary=/dev/null
summary_init() {
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
# Exits non-zero when anything failed.
finish() {
  note "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}

# ---- steps into one log ($log) under the deadline
# run LIMIT TITLE CMD...: at most LIMIT seconds, less when the deadline (minus a margin for the
# summary) is nearer; returns CMD's status (124: out of time, 125: not started for lack of time).
run() {
  local limit=$1 title=$2
  shift 2
  local remaining
  remaining=$(($(seconds_left) - 10))
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
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "(time limit of ${limit} s reached)" >>"$log"
  fi
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
# verdict TITLE MARK STATUS WHERE: TITLE passes with the tally its step printed since MARK, or
# fails with the tally, why the step stopped and WHERE to look.
verdict() {
  local line
  line=$(tally "$2")
  if [ "$3" -eq 0 ]; then
    pass "$1: $line"
  else
    fail "$1: ${line:+$line; }$(why "$3") ($4)"
  fi
}

# ---- the GPU machine (CUDA 13, CMake, ninja; no LLVM)
# What the GPU checks run with: the prebuilt inputs (carried from the LLVM machine) and Python.
# shellcheck disable=SC2034 # used by the scripts that source this
gpu_inputs=${MOE_GPU_INPUTS:-$root/gpu-inputs}
python=${PYTHON:-python3}
# nvcc and compute-sanitizer live in the toolkit's bin/.
gpu_path_setup() {
  local dir
  for dir in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer; do
    [ -d "$dir" ] && PATH="$PATH:$dir"
  done
  export PATH
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

# gpu_check_start LOG: tools on PATH, the tally into $out/summary.txt, and log=$out/LOG begun
# with the machine, the toolchain, and the Python ($python) with its torch and transformers.
# shellcheck disable=SC2154 # out and python are the caller's
gpu_check_start() {
  mkdir -p "$out"
  gpu_path_setup
  export PYTHONUNBUFFERED=1
  summary_init "$out/summary.txt"
  log="$out/$1"
  gpu_environment "$log"
  {
    echo "python: $($python --version 2>&1)"
    $python -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>&1
    $python -c 'import transformers; print("transformers", transformers.__version__)' 2>&1
  } >>"$log" 2>&1
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
