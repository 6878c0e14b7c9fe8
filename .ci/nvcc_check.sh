#!/usr/bin/env bash
# Compile-check every CUDA source in csrc/ for sm_90 without a GPU and without torch's CUDA headers.
#
# The .cu files include CUDA headers only (the CPU build of torch lacks c10's CUDA headers), so a bare
# nvcc compile is the whole check.  The -D__CUDA_NO_* macros are the ones torch.utils.cpp_extension
# passes to nvcc, so a kernel that relies on implicit half/bfloat16 operators fails here as it would in
# the real JIT build.  -Xptxas -v prints registers, spills and shared memory per kernel.
# Usage: .ci/nvcc_check.sh [ARCH]   (ARCH defaults to sm_90; NVCC overrides the compiler)
set -euo pipefail

ARCH="${1:-sm_90}"
NVCC="${NVCC:-nvcc}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="$(mktemp -d "${TMPDIR:-/tmp}/relu2-nvcc-check.XXXXXX")"
trap 'rm -rf "$OUT_DIR"' EXIT

command -v "$NVCC" >/dev/null || { echo "nvcc_check: $NVCC not found" >&2; exit 2; }
"$NVCC" --version | tail -n 2

shopt -s nullglob
sources=("$ROOT"/csrc/*.cu)
if [ ${#sources[@]} -eq 0 ]; then
  echo "nvcc_check: no .cu files under $ROOT/csrc" >&2
  exit 1
fi

failed=0
for src in "${sources[@]}"; do
  obj="$OUT_DIR/$(basename "${src%.cu}").o"
  echo "== $NVCC -arch=$ARCH -std=c++17 -O3 -c $(basename "$src")"
  if ! "$NVCC" -arch="$ARCH" -std=c++17 -O3 -lineinfo -Xptxas -v \
      -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ \
      -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__ \
      -c "$src" -o "$obj" 2>&1; then
    echo "nvcc_check: FAILED to compile $src" >&2
    failed=1
  fi
done

if [ "$failed" -ne 0 ]; then
  exit 1
fi
echo "nvcc_check: all ${#sources[@]} CUDA source(s) compile for $ARCH"
