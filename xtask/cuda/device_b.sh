#!/usr/bin/env bash
# Second device call (carry .cuda/b), right after device_a.sh while the machine is warm: rebuild
# libmlx from its halves, install MLX 0.32.4 (CUDA) + mlx-lm 0.32.2 into /tmp/mlxcuda/site (Python
# and the worker share that one libmlx.so), smoke-test both, then run bench.py.
# Env: RUNS (7), MAX_NEW (256), PROMPTS (short,long,long4x), MODEL ($S/model); BENCH=batch runs
# batch.py instead (RUNS 3, MAX_NEW 128, WIDTHS 1,2,4,8); BENCH=constrained constrained.py
# (RUNS 5, MAX_NEW 256, MODEL $S/model2); BENCH=launch launch_probe.py (mlx-lm alone); BENCH=ops
# bench.py under several CUDA graph settings (OPS; RUNS 3, PROMPTS short,long).
set -uo pipefail
S=/tmp/mlxcuda
SITE=$S/site
OUT=${OUT:-$S/out}
mkdir -p $S "$OUT"
[ -f $S/libmlx.so.xz.part0 ] || { echo "no $S/libmlx.so.xz.part0: run device_a.sh first on this (warm) machine"; exit 3; }
if [ ! -f $SITE/mlx/lib/libmlx.so ]; then
  cat $S/libmlx.so.xz.part0 .cuda/b/libmlx.so.xz.part1 >$S/libmlx.so.xz
  echo "$(cat .cuda/b/libmlx.so.xz.sha256)  $S/libmlx.so.xz" | sha256sum -c - || exit 4
  rm -rf $SITE && mkdir -p $SITE
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SITE \
    .cuda/b/mlx-0.32.4-*.whl .cuda/b/mlx_lm-0.32.2-*.whl || exit 5
  tar -xJf .cuda/b/mlx-cuda-rest.tar.xz -C $SITE
  mkdir -p $SITE/mlx/lib && xz -dc $S/libmlx.so.xz >$SITE/mlx/lib/libmlx.so
  # As the build lays it out: <bin>/../mlx is the MLX distribution, nvidia/ beside its mlx/.
  mkdir -p $S/bin && xz -dc .cuda/b/mlx-worker.xz >$S/bin/mlx-worker && chmod +x $S/bin/mlx-worker
  ln -sfn $SITE $S/mlx
fi
NV=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])')
# libmlx's RPATH is $ORIGIN/../../nvidia/{cu13,cudnn,nccl,...}/lib: make it resolve here too.
ln -sfn "$NV" $SITE/nvidia
export LD_LIBRARY_PATH=$NV/cu13/lib:$NV/cudnn/lib:$NV/nccl/lib:$SITE/mlx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$SITE PYTHONUNBUFFERED=1
# The worker needs no environment: its rpath finds libmlx, libmlx's RPATH the NVIDIA libraries.
echo "== ldd mlx-worker (empty environment)"
env -i ldd $S/bin/mlx-worker | grep -E 'not found|mlx|cublas|cudnn|nccl|nvrtc|libcuda|cufft|lapack'
echo '{"jsonrpc":"2.0","id":1,"method":"initialize"}' | (cd / && env -i $S/bin/mlx-worker 2>/dev/null) |
  python3 -c 'import json,sys; print("initialize, empty environment, from /:", json.loads(sys.stdin.readline())["result"]["mlx"])' ||
  echo "WORKER SMOKE FAILED"
echo "== mlx python smoke"
python3 - <<'PY' || echo "MLX PYTHON SMOKE FAILED"
import time, mlx.core as mx
print(mx.__version__, mx.default_device(), "cuda available:", mx.cuda.is_available(), mx.device_info())
a = mx.random.normal((4096, 4096)).astype(mx.bfloat16)
mx.eval(a @ a)
t = time.perf_counter()
for _ in range(20):
    a = (a @ a) * (1 / 64)  # each product depends on the last, so all 20 run
mx.eval(a); dt = (time.perf_counter() - t) / 20
print(f"bf16 4096^3 matmul: {2 * 4096**3 / dt / 1e12:.0f} TFLOP/s")
PY
echo "== bench ${BENCH:-single}"
if [ "${BENCH:-single}" = constrained ]; then
  # Decode with a JSON schema vs free text, the worker alone (llguidance's mask on the GPU path).
  (cd xtask/cuda && timeout ${BENCH_TIMEOUT:-420} python3 constrained.py --worker $S/bin/mlx-worker \
    --model ${MODEL:-$S/model2} --runs ${RUNS:-5} --max-new-tokens ${MAX_NEW:-256} --out "$OUT")
elif [ "${BENCH:-single}" = launch ]; then
  # Fewer kernels per layer in mlx-lm's own decode (launch_probe.py).
  timeout ${BENCH_TIMEOUT:-420} python3 xtask/cuda/launch_probe.py ${MODEL:-$S/model2} ${RUNS:-5} ${MAX_NEW:-256}
elif [ "${BENCH:-single}" = ops ]; then
  # MLX's CUDA graphs (docs/decisions/cuda.md, "Not done"): each setting (comma-separated
  # MLX_* assignments, or `default`) runs bench.py, both sides under it.
  i=0
  for SET in ${OPS:-default MLX_USE_CUDA_GRAPHS=0 MLX_MAX_OPS_PER_BUFFER=400,MLX_MAX_MB_PER_BUFFER=100000 MLX_MAX_OPS_PER_BUFFER=30}; do
    i=$((i + 1)); E=${SET//,/ }; [ "$SET" = default ] && E=
    echo "== setting $i: ${SET}"; mkdir -p "$OUT/ops-$i"
    env $E timeout ${BENCH_TIMEOUT:-150} python3 xtask/cuda/bench.py --worker $S/bin/mlx-worker \
      --model ${MODEL:-$S/model2} --runs ${RUNS:-3} --max-new-tokens ${MAX_NEW:-256} \
      --prompts ${PROMPTS:-short,long} --out "$OUT/ops-$i" | grep -E '^\| (prefill|decode)|^[a-z0-9]+:|greedy'
    echo "$SET" >"$OUT/ops-$i/setting.txt"
  done
elif [ "${BENCH:-single}" = batch ]; then
  # Continuous batching: WIDTHS streams at once, worker (--max-batch) vs mlx-lm's batch_generate.
  timeout ${BENCH_TIMEOUT:-420} python3 xtask/cuda/batch.py --worker $S/bin/mlx-worker --model ${MODEL:-$S/model} \
    --runs ${RUNS:-3} --max-new-tokens ${MAX_NEW:-128} --widths ${WIDTHS:-1,2,4,8} --out "$OUT"
else
  timeout ${BENCH_TIMEOUT:-420} python3 xtask/cuda/bench.py --worker $S/bin/mlx-worker --model ${MODEL:-$S/model} \
    --runs ${RUNS:-7} --max-new-tokens ${MAX_NEW:-256} --prompts ${PROMPTS:-short,long,long4x} --out "$OUT"
fi
rc=$?
echo "bench rc=$rc"; tail -20 "$OUT/worker-stderr.log" 2>/dev/null
exit $rc
