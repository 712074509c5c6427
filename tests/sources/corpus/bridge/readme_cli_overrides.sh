uv run python -m torch.distributed.run --nproc_per_node=8 run_recipe.py \
    --recipe llama32_1b_pretrain_1gpu_h100_bf16_config \
    train.train_iters=5000 \
    optimizer.lr=0.0002 \
    model.tensor_model_parallel_size=2
