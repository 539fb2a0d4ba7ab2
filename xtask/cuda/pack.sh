#!/usr/bin/env bash
# Builds the CUDA mlx-worker here with the one documented command (README, "With an NVIDIA GPU":
# `cargo build --release -p mlx-worker --features cuda`, no GPU or CUDA toolkit needed) and
# stages what the two device calls carry: `.cuda/a` (first half of the xz'd CUDA libmlx,
# SmolLM2's tokenizer files) and `.cuda/b` (second half, the stripped worker, MLX's CUDA headers
# and bundled libs, the mlx and mlx-lm wheels). The NVIDIA wheels the build unpacked beside libmlx
# (about 3 GB) do not fit a carry: on the device the image's own `nvidia/` stands in for them.
# See docs/decisions/cuda.md.
#
# Usage: xtask/cuda/pack.sh   (from anywhere; needs pip, xz, and a clean HEAD to build from)
set -euo pipefail
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
WORK=${CUDA_WORK:-/tmp/cudawh}
TARGET=${CARGO_TARGET_DIR:-/tmp/target-cuda}
V=0.32.4
mkdir -p "$WORK/stage"
cd "$WORK"

# 1. The worker, from a clean export of HEAD (not the working tree).
rm -rf src && mkdir src && git -C "$ROOT" archive HEAD | tar -x -C src
(cd src && CARGO_TARGET_DIR="$TARGET" cargo build --release -p mlx-worker --features cuda)
DIST=$(readlink -f "$TARGET/mlx")  # the mlx-cuda-13 distribution the build linked, NVIDIA libs beside
strip -o stage/mlx-worker "$TARGET/release/mlx-worker"
readelf -d stage/mlx-worker | grep -E 'NEEDED|RPATH|RUNPATH'
echo "unresolved here (the driver's libcuda.so.1 only, on a machine without one):"
ldd "$TARGET/release/mlx-worker" | grep 'not found' || true
strip --strip-unneeded -o stage/libmlx.so "$DIST/mlx/lib/libmlx.so"

# 2. The Python side's wheels (Python 3.12, manylinux_2_35: what the GPU image runs).
[ -f mlx_lm-$V-py3-none-any.whl ] ||
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_35_x86_64 -d . mlx==$V mlx-lm==$V

# 3. Stage the two carries.
rm -rf "$ROOT/.cuda" && mkdir -p "$ROOT/.cuda/a/tokenizer" "$ROOT/.cuda/b"
EXCLUDE=$(git -C "$ROOT" rev-parse --path-format=absolute --git-path info/exclude)  # a worktree's too
grep -qx '/.cuda/' "$EXCLUDE" 2>/dev/null || echo '/.cuda/' >>"$EXCLUDE"
xz -T2 -9e -c stage/libmlx.so >stage/libmlx.so.xz
split -b 45000000 -d -a 1 stage/libmlx.so.xz "$ROOT/.cuda/libmlx.so.xz.part"
mv "$ROOT/.cuda/libmlx.so.xz.part0" "$ROOT/.cuda/a/"
mv "$ROOT/.cuda/libmlx.so.xz.part1" "$ROOT/.cuda/b/"
sha256sum stage/libmlx.so.xz | cut -d' ' -f1 >"$ROOT/.cuda/b/libmlx.so.xz.sha256"
SMOL=${SMOLLM2_DIR:-$HOME/.cache/mlx-worker/models/SmolLM2-135M-Instruct}
cp "$SMOL"/tokenizer.json "$SMOL"/tokenizer_config.json "$ROOT/.cuda/a/tokenizer/"
xz -T2 -9 -c stage/mlx-worker >"$ROOT/.cuda/b/mlx-worker.xz"
(cd "$DIST" && tar -cJf "$ROOT/.cuda/b/mlx-cuda-rest.tar.xz" mlx/include mlx/share \
  mlx_cuda_13.libs mlx_cuda_13-$V.dist-info)
cp mlx-$V-cp312-*.whl mlx_lm-$V-py3-none-any.whl "$ROOT/.cuda/b/"
du -sh "$ROOT/.cuda/a" "$ROOT/.cuda/b"
