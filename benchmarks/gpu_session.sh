#!/usr/bin/env bash
# One prepared GPU session (device time is short): the cuda-marked tests, the estimator against
# the CUDA allocator, MFU and recompute overheads against the FLOP model, grouped GEMM.
# Every part has its own time limit and writes into $OUT as it goes.
#   OUT=DIR bash benchmarks/gpu_session.sh
set -u
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
OUT=${OUT:?set OUT to a folder}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/device.txt"
timeout 170 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_cuda.py 2>&1 | tail -15 | tee "$OUT/cuda_tests.txt"
timeout 240 python3 benchmarks/gpu.py --out "$OUT" --sections memory,mfu 2>&1 | tee "$OUT/gpu_log.txt"
timeout 60 python3 benchmarks/moe_grouped.py --device cuda --dtype bf16 --rounds 5 2>&1 \
    | tee "$OUT/moe_grouped.txt"
