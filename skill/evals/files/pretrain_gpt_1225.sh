torchrun --nproc_per_node 1 pretrain_gpt.py \
    --tensor-model-parallel-size 1 \
    --pipeline-model-parallel-size 1 \
    --recompute-activations \
    --transformer-impl transformer_engine \
    --bf16
