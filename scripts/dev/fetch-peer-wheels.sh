#!/usr/bin/env bash
# Downloads, here (PyPI reachable), the wheels of the peers that bench/bench.py times on the GPU
# machine (Python 3.12, no network) into the git-ignored .whl/ (docs/benchmarks.md, "Running the
# peers on the GPU machine"):
#   liger  liger-kernel (pure Python + Triton);
#   sonic  sonic-moe and what it imports that the GPU machine lacks: quack-kernels,
#          nvidia-cutlass-dsl (a meta wheel), apache-tvm-ffi, torch-c-dlpack-ext, einops, and
#          nvidia-cutlass-dsl-libs-base (MOE_CUTLASS_LIBS=cu13: nvidia-cutlass-dsl-libs-cu13),
#          whose 74 MB wheel is more than one device call carries: it is unpacked and
#          recompressed as .whl/cutlass-dsl-libs.tar.xz (tar | xz -9), which
#          scripts/gpu/session.sh's sonic step unpacks into its site folder;
#   megablocks  into .whl/megablocks/ (a call carries that folder alone): the source packages
#          megablocks 0.10.0, stanford-stk 0.7.1 and grouped_gemm 0.3.0 (CUDA extensions:
#          scripts/dev/build-megablocks.sh builds them on the GPU machine), and the build tools
#          its Python may lack: setuptools (< 79, as megablocks asks) and ninja. Their metadata
#          step imports torch, so PYTHON must have torch; TORCH_CUDA_ARCH_LIST=9.0 keeps it from
#          asking a GPU for its capability.
# Prints each file's size and the total beside what else a call carries (gpu-inputs/sonic or
# gpu-inputs/megablocks): one call carries at most 64 MiB.
#   bash scripts/dev/fetch-peer-wheels.sh [liger|sonic|megablocks|all]   (default sonic)
# Environment: PYTHON (default /usr/bin/python3), MOE_CUTLASS_LIBS (base or cu13).
set -u -o pipefail
# shellcheck source=../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
what=${1:-sonic}
case "$what" in -h | --help) usage ;; liger | sonic | megablocks | all) ;; *) die "unknown peer $what (see --help)" ;; esac
py=${PYTHON:-/usr/bin/python3}
whl=$root/.whl
mkdir -p "$whl"
git -C "$root" check-ignore -q "$whl/x.whl" || die ".whl/ is not git-ignored: wheels must not be committed"

download() {
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any \
    -d "$whl" "$@" || die "pip download $* failed"
}

if [ "$what" = liger ] || [ "$what" = all ]; then
  download liger-kernel==0.8.5
fi
if [ "$what" = megablocks ] || [ "$what" = all ]; then
  # sdists: pip prepares their metadata by running setup.py, which imports torch
  mkdir -p "$whl/megablocks"
  TORCH_CUDA_ARCH_LIST=9.0 "$py" -m pip download -q --no-deps --no-binary=:all: \
    --no-build-isolation -d "$whl/megablocks" megablocks==0.10.0 stanford-stk==0.7.1 \
    grouped_gemm==0.3.0 || die "pip download of the megablocks sdists failed (PYTHON must have torch)"
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any \
    -d "$whl/megablocks" "setuptools>=70.1,<79" ninja || die "pip download setuptools ninja failed"
  ls -l "$whl/megablocks"
fi
if [ "$what" = sonic ] || [ "$what" = all ]; then
  download sonic-moe==0.1.2.post1 quack-kernels==0.3.11 nvidia-cutlass-dsl==4.4.2 \
    "apache-tvm-ffi>=0.1.6,<0.2" torch-c-dlpack-ext einops
  libs=nvidia-cutlass-dsl-libs-base
  [ "${MOE_CUTLASS_LIBS:-base}" = cu13 ] && libs=nvidia-cutlass-dsl-libs-cu13
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 -d "$tmp" "$libs==4.4.2" || die "pip download $libs failed"
  mkdir "$tmp/unpacked"
  (cd "$tmp/unpacked" && "$py" -m zipfile -e "$tmp"/*.whl .) || die "cannot unpack the $libs wheel"
  if ! tar -cf - -C "$tmp/unpacked" . | xz -T2 -9 >"$whl/cutlass-dsl-libs.tar.xz.part"; then
    die "tar | xz failed"
  fi
  mv "$whl/cutlass-dsl-libs.tar.xz.part" "$whl/cutlass-dsl-libs.tar.xz"
  # the unpacked libs wheel must not travel too
  rm -f "$whl"/nvidia_cutlass_dsl_libs_*.whl
  echo "$libs==4.4.2" >"$whl/cutlass-dsl-libs.txt"
fi
ls -l "$whl"
# what one call carries: the sonic step's .whl (less .whl/megablocks) and gpu-inputs/sonic, or
# the megablocks step's .whl/megablocks and gpu-inputs/megablocks
if [ "$what" = megablocks ]; then
  carried=(.whl/megablocks gpu-inputs/megablocks)
else
  carried=(.whl gpu-inputs/sonic)
fi
total=0
for path in "${carried[@]}"; do
  kib=0
  [ -d "$root/$path" ] && kib=$(du -sk "$root/$path" | cut -f1)
  [ "$path" = .whl ] && [ -d "$whl/megablocks" ] && kib=$((kib - $(du -sk "$whl/megablocks" | cut -f1)))
  echo "$path: $((kib / 1024)) MiB ($kib KiB)"
  total=$((total + kib))
done
echo "together $((total / 1024)) MiB of the 64 MiB one call carries (${carried[*]})"
[ "$total" -le $((64 * 1024)) ] || die "over 64 MiB: carry fewer layers"
