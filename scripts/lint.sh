#!/usr/bin/env bash
# The repository's guards: the same checks that .pre-commit-config.yaml runs before a commit,
# and ctest (moe-lint) runs over the whole tree.
#   - clang-format: clang-format-22 over all C++ and CUDA (.cpp .h .cu; runtime/, examples/
#     and test/ included)
#   - ruff: ruff check and ruff format --check over all Python (settings: ruff.toml)
#   - shellcheck: over all shell scripts (*.sh, and files with a sh/bash shebang)
#   - large-files: no file over 1 MiB (generated files and logs belong in build/ or $OUT)
#
#   scripts/lint.sh [--fix] [CHECK...] [-- FILE...]
# With no CHECK, all four. With no FILE, every file git tracks or would add (untracked, not
# ignored); a FILE of another kind than a check's is skipped by that check. --fix lets
# clang-format and ruff rewrite what they can. Exits non-zero when a check finds anything.
# The tools come from scripts/install-deps.sh (pinned versions).
# shellcheck disable=SC2154 # parse_options (scripts/common.sh) sets the options' variables
set -uo pipefail
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

parse_options --fix:fix=1 -- "$@"
checks=("${positional[@]}")
files=("${rest[@]}")
for check in "${checks[@]}"; do
  case "$check" in
  clang-format | ruff | shellcheck | large-files) ;;
  *) die "unknown check $check (see --help)" ;;
  esac
done
[ ${#checks[@]} -gt 0 ] || checks=(clang-format ruff shellcheck large-files)
cd "$root" || exit 2
if [ ${#files[@]} -eq 0 ]; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard | sort -u)
fi
# Files that exist (a deleted file is still in git's index until the commit).
present=()
for file in "${files[@]}"; do
  [ -f "$file" ] && present+=("$file")
done

cxx=() python=() shell=()
for file in "${present[@]}"; do
  case "$file" in
  *.cpp | *.h | *.cu) cxx+=("$file") ;;
  *.py) python+=("$file") ;;
  *.sh) shell+=("$file") ;;
  *.*) ;;
  *) head -n 1 "$file" 2>/dev/null | grep -qE '^#!.*\b(ba)?sh\b' && shell+=("$file") ;;
  esac
done

status=0
# tool NAME: the tool, or a failure saying how to install it
tool() {
  command -v "$1" >/dev/null && return 0
  echo "lint: $1 not found: scripts/install-deps.sh installs it" >&2
  status=1
  return 1
}
for check in "${checks[@]}"; do
  case "$check" in
  clang-format)
    if [ ${#cxx[@]} -eq 0 ] || ! tool clang-format-22; then continue; fi
    if [ "$fix" = 1 ]; then
      clang-format-22 -i "${cxx[@]}" || status=1
    else
      clang-format-22 --dry-run -Werror "${cxx[@]}" || status=1
    fi
    ;;
  ruff)
    if [ ${#python[@]} -eq 0 ] || ! tool ruff; then continue; fi
    if [ "$fix" = 1 ]; then
      ruff check --fix --quiet "${python[@]}" || status=1
      ruff format --quiet "${python[@]}" || status=1
    else
      ruff check --quiet "${python[@]}" || status=1
      ruff format --check --quiet "${python[@]}" || status=1
    fi
    ;;
  shellcheck)
    if [ ${#shell[@]} -eq 0 ] || ! tool shellcheck; then continue; fi
    shellcheck "${shell[@]}" || status=1
    ;;
  large-files)
    for file in "${present[@]}"; do
      size=$(stat -c %s "$file")
      if [ "$size" -gt $((1024 * 1024)) ]; then
        echo "lint: $file is $((size / 1024)) KiB, over the 1 MiB limit" >&2
        status=1
      fi
    done
    ;;
  esac
done
if [ $status = 0 ]; then
  echo "lint: ${checks[*]}: clean (${#present[@]} files)"
else
  echo "lint: FAILED" >&2
fi
exit $status
