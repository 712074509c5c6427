#!/bin/bash
# Launch pattern: TRL docs/source/example_overview.md "Distributed Training (for scripts)"
#   accelerate launch --config_file=examples/accelerate_configs/multi_gpu.yaml --num_processes {NUM_GPUS} path_to_script.py --all_arguments_of_the_script
# with the FSDP2 config examples/accelerate_configs/fsdp2.yaml (TRL, commit f2cd577).
# Script arguments: trl/scripts/sft.py docstring "# Full training" (model id changed to
# meta-llama/Llama-3.1-8B, output dir renamed, Qwen-specific --eos_token '<|im_end|>' dropped).
# Added by the user: --max_length 8192 --per_device_train_batch_size 2 (already 2) --gradient_checkpointing
accelerate launch --config_file=examples/accelerate_configs/fsdp2.yaml --num_processes 8 trl/scripts/sft.py \
    --model_name_or_path meta-llama/Llama-3.1-8B \
    --dataset_name trl-lib/Capybara \
    --learning_rate 2.0e-5 \
    --num_train_epochs 1 \
    --packing \
    --per_device_train_batch_size 2 \
    --gradient_accumulation_steps 8 \
    --eval_strategy steps \
    --eval_steps 100 \
    --output_dir Llama-3.1-8B-SFT \
    --push_to_hub \
    --max_length 8192 \
    --gradient_checkpointing
