#!/usr/bin/env bash
# A two-GPU group over NCCL (issue 18; needs the nvidia-h200-x2 kind), after device_a.sh and
# device_b.sh on the same warm machine: ranks 0 and 1 of mlx-worker, one GPU each, joined the way
# `mlx.launch --backend nccl` joins them (NCCL_HOST_IP, NCCL_PORT, MLX_WORLD_SIZE, MLX_RANK).
# Rank 0 reads $REQUESTS (JSON-RPC lines; `"parallel": "tensor"` or `"pipeline"` on load) and
# writes its answers to $OUT/group-<mode>.jsonl.  Env: REQUESTS, MODE (a label), PORT (12355).
set -uo pipefail
S=/tmp/mlxcuda
OUT=${OUT:-$S/out}
MODE=${MODE:-tensor}
PORT=${PORT:-12355}
NV=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])')
export LD_LIBRARY_PATH=$NV/cu13/lib:$NV/cudnn/lib:$NV/nccl/lib:$S/site/mlx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_HOST_IP=127.0.0.1 NCCL_PORT=$PORT MLX_WORLD_SIZE=2
MLX_RANK=1 CUDA_VISIBLE_DEVICES=1 $S/bin/mlx-worker </dev/null >/dev/null 2>"$OUT/group-$MODE-rank1.log" &
MLX_RANK=0 CUDA_VISIBLE_DEVICES=0 $S/bin/mlx-worker <"$REQUESTS" >"$OUT/group-$MODE.jsonl" 2>"$OUT/group-$MODE-rank0.log"
echo "rank 0 exit $?"; wait; echo "rank 1 exit $?"
grep -h '"result"' "$OUT/group-$MODE.jsonl" | cut -c1-300
