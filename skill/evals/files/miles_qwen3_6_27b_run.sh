python train.py \
    --megatron-to-hf-mode bridge \
    --tensor-model-parallel-size 4 \
    --seq-length 32768 \
    --recompute-granularity full \
    --recompute-method uniform \
    --recompute-num-layers 1 \
    --optimizer-cpu-offload
