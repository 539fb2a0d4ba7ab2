#!/usr/bin/env bash
# First device call (carry .cuda/a): stash the first half of libmlx in /tmp/mlxcuda (kept while
# the machine stays warm), report the image's CUDA libraries, and write the random
# Llama-3.2-1B-shaped bf16 models with PyTorch (MLX is not there yet).
set -uo pipefail
S=/tmp/mlxcuda
mkdir -p $S
cp .cuda/a/libmlx.so.xz.part0 $S/ && echo "stashed part0"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c 'import sys; print(sys.version)'
NV=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__file__) if nvidia.__file__ else list(nvidia.__path__)[0])')
echo "nvidia packages: $NV"; ls "$NV"; ls "$NV"/cu13/lib "$NV"/cudnn/lib "$NV"/nccl/lib 2>&1 | head -60
ls -d "$NV"/cu13/include /usr/local/cuda*/include 2>&1
python3 -m pip list 2>/dev/null | grep -iE '^(nvidia-|transformers|numpy|sentencepiece|protobuf|pyyaml|jinja2|safetensors|tokenizers|huggingface) '
[ -f $S/model/model.safetensors ] || python3 xtask/cuda/make_model.py $S/model .cuda/a/tokenizer
# The same shapes with embedding std 0.02: logits of order 1 (see make_model.py); bench.py uses it.
[ -f $S/model2/model.safetensors ] || python3 xtask/cuda/make_model.py $S/model2 .cuda/a/tokenizer 0.02
ls -la $S $S/model $S/model2
