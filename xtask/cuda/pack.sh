#!/usr/bin/env bash
# Builds the CUDA mlx-worker here (no GPU, no CUDA toolkit needed) and stages what the two device
# calls carry: `.cuda/a` (first half of the xz'd CUDA libmlx, SmolLM2's tokenizer files) and
# `.cuda/b` (second half, the stripped worker, MLX's CUDA headers and bundled libs, the mlx and
# mlx-lm wheels). See docs/decisions/cuda.md.
#
# How the worker links MLX's CUDA build: mlx-c is compiled against the headers and CMake config of
# the CPU wheel (identical headers: `diff -r` of mlx/include/mlx is empty), and the final binary is
# linked against the CUDA wheel's libmlx.so with `--allow-shlib-undefined`, because that library's
# NEEDED cuBLAS/cuDNN/NCCL/NVRTC/libcuda exist only on the GPU machine. `MLX_DIR` points mlx-sys at
# a hybrid distribution (CPU headers + cmake, CUDA libmlx); the link argument is given to the final
# crate only (`cargo rustc`), so the workspace's rpath rustflags and every dependency's fingerprint
# stay as they are.
#
# Usage: xtask/cuda/pack.sh   (from anywhere; needs pip, xz, the mlx-cpu 0.32.2 wheel in
#        ~/.cache/mlx-sys/ from an ordinary `cargo build`, and a clean HEAD to build from)
set -euo pipefail
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
WORK=${CUDA_WORK:-/tmp/cudawh}
TARGET=${CARGO_TARGET_DIR:-/tmp/target-cuda}
CPU_DIST=${MLX_CPU_DIST:-$HOME/.cache/mlx-sys/mlx-cpu-0.32.2}
V=0.32.2
mkdir -p "$WORK"
cd "$WORK"

# 1. Wheels (Python 3.12, manylinux_2_35: what the GPU image runs).
[ -f mlx_cuda_13-$V-py3-none-manylinux_2_35_x86_64.whl ] ||
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_35_x86_64 -d . mlx==$V mlx-cuda-13==$V mlx-lm==$V
rm -rf cuda && mkdir cuda && (cd cuda && unzip -q ../mlx_cuda_13-$V-*.whl)
diff -r "$CPU_DIST/mlx/include/mlx" cuda/mlx/include/mlx  # must be identical

# 2. Stripped CUDA libmlx; the hybrid distribution mlx-sys builds against.
mkdir -p stage
strip --strip-unneeded -o stage/libmlx.so cuda/mlx/lib/libmlx.so
rm -rf hybrid && mkdir -p hybrid/mlx/lib
cp -a "$CPU_DIST/mlx/include" "$CPU_DIST/mlx/share" hybrid/mlx/
cp stage/libmlx.so hybrid/mlx/lib/libmlx.so

# 3. The worker, from a clean export of HEAD (not the working tree).
rm -rf src && mkdir src && git -C "$ROOT" archive HEAD | tar -x -C src
(cd src && CARGO_TARGET_DIR="$TARGET" MLX_DIR="$WORK/hybrid" cargo rustc --release -p mlx-worker \
  --features cuda --bin mlx-worker -- -C link-arg=-Wl,--allow-shlib-undefined)
strip -o stage/mlx-worker "$TARGET/release/mlx-worker"
readelf -d stage/mlx-worker | grep -E 'NEEDED|RPATH|RUNPATH'

# 4. Stage the two carries.
rm -rf "$ROOT/.cuda" && mkdir -p "$ROOT/.cuda/a/tokenizer" "$ROOT/.cuda/b"
grep -qx '/.cuda/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.cuda/' >>"$ROOT/.git/info/exclude"
xz -T2 -9e -c stage/libmlx.so >stage/libmlx.so.xz
split -b 45000000 -d -a 1 stage/libmlx.so.xz "$ROOT/.cuda/libmlx.so.xz.part"
mv "$ROOT/.cuda/libmlx.so.xz.part0" "$ROOT/.cuda/a/"
mv "$ROOT/.cuda/libmlx.so.xz.part1" "$ROOT/.cuda/b/"
sha256sum stage/libmlx.so.xz | cut -d' ' -f1 >"$ROOT/.cuda/b/libmlx.so.xz.sha256"
SMOL=${SMOLLM2_DIR:-$HOME/.cache/mlx-worker/models/SmolLM2-135M-Instruct}
cp "$SMOL"/tokenizer.json "$SMOL"/tokenizer_config.json "$ROOT/.cuda/a/tokenizer/"
xz -T2 -9 -c stage/mlx-worker >"$ROOT/.cuda/b/mlx-worker.xz"
(cd cuda && tar -cJf "$ROOT/.cuda/b/mlx-cuda-rest.tar.xz" mlx/include mlx/share mlx_cuda_13.libs \
  mlx_cuda_13-$V.dist-info)
cp mlx-$V-cp312-*.whl mlx_lm-$V-py3-none-any.whl "$ROOT/.cuda/b/"
du -sh "$ROOT/.cuda/a" "$ROOT/.cuda/b"
