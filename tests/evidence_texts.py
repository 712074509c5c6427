# ruff: noqa: E501  (verbatim log lines are longer than 100 characters and must stay whole)
"""Real text for the evidence tests (tests/test_evidence*.py): verbatim blocks from
shared/reference/real-formats.md and the seeds (each with the URL its block names), output of
the real PyTorch code run here or on a GPU (tests/data/evidence, made by make_gpu_samples.py),
and the fields each real OOM message prints."""

from __future__ import annotations

import json
import re
from pathlib import Path

from recompute_kit.doctor.evidence import (
    Evidence,
    OOMEvent,
    clean_line,
    parse_config,
    parse_experiments,
    parse_log,
    parse_memory_stats,
    parse_oom,
)

DATA = Path(__file__).parent / "data" / "evidence"
KiB, MiB, GiB = 2**10, 2**20, 2**30


def nbytes(number: float, unit: int) -> int:
    """Bytes of a printed size, rounded to the nearest byte (as parse_size does)."""
    return round(number * unit)


# =============================================================================================
# Verbatim text from shared/reference/real-formats.md (block name, kind, source URL above each)
# =============================================================================================

# oom-pt-16417-title (cuda_oom/gen1_cached), verbatim from https://github.com/pytorch/pytorch/issues/16417
OOM_GEN1 = """\
RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total capacity; 8.57 MiB already allocated; 9.28 GiB free; 4.68 MiB cached)
"""

# oom-unilm-137 (cuda_oom/gen2_reserved), verbatim from https://github.com/microsoft/unilm/issues/137
OOM_GEN2 = """\
RuntimeError: CUDA out of memory. Tried to allocate 128.00 MiB (GPU 0; 11.17 GiB total capacity; 10.85 GiB already allocated; 24.81 MiB free; 10.86 GiB reserved in total by PyTorch)
"""

# oom-mlm-525 (cuda_oom/gen3_max_split), verbatim from https://github.com/NVIDIA/Megatron-LM/issues/525
OOM_GEN3 = """\
torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB (GPU 0; 31.74 GiB total capacity; 28.82 GiB already allocated; 577.12 MiB free; 29.97 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF
"""

# oom-pt-pr99699 (cuda_oom/gen4_capacty/other_process), verbatim from https://github.com/pytorch/pytorch/pull/99699
OOM_GEN4 = """\
torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 138.00 MiB.
GPU 0 has a total capacty of 15.90 GiB of which 8.44 MiB is free.
Process 1246069 has 577.00 MiB memory in use. Including non-PyTorch memory,
this process has 15.32 GiB memory in use. Of the allocated memory
14.12 GiB is allocated by PyTorch, and 410.41 MiB is reserved
by PyTorch but unallocated. If reserved but unallocated memory is large
try setting max_split_size_mb to avoid fragmentation.  See documentation
 for Memory Management and PYTORCH_CUDA_ALLOC_CONF
"""

# oom-pt-16417-comment (cuda_oom/gen5_expandable), verbatim from https://github.com/pytorch/pytorch/issues/16417
OOM_GEN5 = """\
torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a total capacity of 23.65 GiB of which 11.06 MiB is free. Including non-PyTorch memory, this process has 23.60 GiB memory in use. Of the allocated memory 22.90 GiB is allocated by PyTorch, and 194.87 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
"""

# oom-msswift-9191 (cuda_oom/gen6_pytorch_alloc_conf), verbatim from https://github.com/modelscope/ms-swift/issues/9191
OOM_GEN6 = """\
[rank97]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 48.00 MiB. GPU 1 has a total capacity of 139.81 GiB of which 22.44 MiB is free. Including non-PyTorch memory, this process has 139.78 GiB memory in use. Of the allocated memory 138.20 GiB is allocated by PyTorch, and 40.42 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
"""

# ex-mlm-756-iters (megatron_iteration_log), verbatim from https://github.com/NVIDIA/Megatron-LM/issues/756
MLM_756_ITERS = """\
 [2024-04-06 03:02:12] iteration       71/     100 | consumed samples:         9088 | elapsed time per iteration (ms): 5361.6 | throughput per GPU (TFLOP/s/GPU): 243.6 | learning rate: 1.420000E-05 | global batch size:   128 | lm loss: 1.818812E+00 | load_balancing_loss: 1.013377E+00 | loss scale: 1.0 | grad norm: 1.300 | num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |
 [2024-04-06 03:02:18] iteration       72/     100 | consumed samples:         9216 | elapsed time per iteration (ms): 5470.7 | throughput per GPU (TFLOP/s/GPU): 238.7 | learning rate: 1.440000E-05 | global batch size:   128 | lm loss: 1.820313E+00 | load_balancing_loss: 1.019612E+00 | loss scale: 1.0 | grad norm: 1.305 | num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |
 [2024-04-06 03:02:24] iteration       73/     100 | consumed samples:         9344 | elapsed time per iteration (ms): 5829.9 | throughput per GPU (TFLOP/s/GPU): 224.0 | learning rate: 1.460000E-05 | global batch size:   128 | lm loss: 1.798953E+00 | load_balancing_loss: 1.010977E+00 | loss scale: 1.0 | grad norm: 1.539 | num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |
"""

# ex-mlm-756-memory (megatron_memory_log+megatron_iteration_log), verbatim from https://github.com/NVIDIA/Megatron-LM/issues/756
MLM_756_MEMORY = """\
[Rank 1] (after 1 iterations) memory (MB) | allocated: 54250.97802734375 | max allocated: 54250.98583984375 | reserved: 61480.0 | max reserved: 61480.0
 [2024-04-06 02:55:45] iteration        2/     100 | consumed samples:          256 | elapsed time per iteration (ms): 5630.1 | throughput per GPU (TFLOP/s/GPU): 231.9 | learning rate: 4.000000E-07 | global batch size:   128 | lm loss: 2.021530E+00 | load_balancing_loss: 1.087362E+00 | loss scale: 1.0 | grad norm: 6.895 | num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |
 [2024-04-06 02:55:50] iteration        3/     100 | consumed samples:          384 | elapsed time per iteration (ms): 5410.6 | throughput per GPU (TFLOP/s/GPU): 241.4 | learning rate: 6.000000E-07 | global batch size:   128 | lm loss: 2.003316E+00 | load_balancing_loss: 1.085377E+00 | loss scale: 1.0 | grad norm: 6.603 | num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:   0 |
"""

# ex-mlm-pr5662 (megatron_iteration_log+megatron_memory_log), verbatim from https://github.com/NVIDIA/Megatron-LM/pull/5662
MLM_PR5662 = """\
[2026-07-10 05:46:31.627699] iteration       20/      20 | consumed samples:          320 | elapsed time per iteration (ms): 744.0 | learning rate: 0.000000E+00 | global batch size:    16 | lm loss: 1.020935E+00 | loss scale: 1.0 | grad norm: 2.939 | number of skipped iterations:   0 | number of nan iterations:   0 |
[Rank 0] (after 20 iterations) memory (MB) | allocated: 3270.16 | max allocated: 5670.39 | reserved: 6406.00 | max reserved: 6406.00
"""

# ex-mb-pr841 (megatron_iteration_log+megatron_memory_log+mbridge_step_time), verbatim from https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/841
MB_PR841 = """\
 [2025-10-02 22:52:07] iteration       10/      50 | consumed samples:         5120 |
elapsed time per iteration (ms): 13212.7 | learning rate: 3.000000E-04 | global batch
size:   512 | lm loss: 4.474437E+00 | loss scale: 1.0 | grad norm: 0.704 | number of s
kipped iterations:   0 | number of nan iterations:   0 |
[Rank 0] (after 10 iterations) memory (MB) | allocated: 11908.05029296875 | max alloca
ted: 12712.43603515625 | reserved: 12954.0 | max reserved: 12954.0
Step Time : 14.26s GPU utilization: 58.2TFLOP/s/GPU
 [2025-10-02 22:54:30] iteration       20/      50 | consumed samples:        10240 |
elapsed time per iteration (ms): 14260.3 | learning rate: 2.604594E-04 | global batch
size:   512 | lm loss: 8.797448E-02 | loss scale: 1.0 | grad norm: 0.170 | number of s
kipped iterations:   0 | number of nan iterations:   0 |
"""

# ex-mb-pr388 (mbridge_step_time), verbatim from https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/388
MB_PR388 = """\
Step Time : 12.78s GPU utilization: 528.1 TFLOP/s/GPU
"""

# ex-nemo-14850 (nemo2_progress_log), verbatim from https://github.com/NVIDIA-NeMo/Speech/issues/14850
NEMO_14850 = (
    " 0: Training epoch 0, iteration 8/29 | lr: 5.389e-06 | global_batch_size: 512 | global_step: 8 | max_memory_reserved: 57466159104 | max_memory_allocated: 53930270720 | reduced_train_loss: 10.22 | train_step_timing in s: 27.01 | consumed_samples: 4608 | TFLOPS_per_GPU: 48.58\n"
    " 0: \n"
    " 0: Training epoch 0, iteration 9/29 | lr: 5.988e-06 | global_batch_size: 512 | global_step: 9 | max_memory_reserved: 57466159104 | max_memory_allocated: 53930270720 | reduced_train_loss: 10.1 | train_step_timing in s: 27.88 | consumed_samples: 5120 | TFLOPS_per_GPU: 85.8\n"
    " 0: \n"
    " 0: Training epoch 0, iteration 10/29 | lr: 6.587e-06 | global_batch_size: 512 | global_step: 10 | max_memory_reserved: 57466159104 | max_memory_allocated: 53930270720 | reduced_train_loss: 10.06 | train_step_timing in s: 26.63 | consumed_samples: 5632 | TFLOPS_per_GPU: 85.8\n"
    " 0: \n"
    " 0: Training epoch 0, iteration 11/29 | lr: 7.186e-06 | global_batch_size: 512 | global_step: 11 | max_memory_reserved: 57675874304 | max_memory_allocated: 53930270720 | reduced_train_loss: 9.924 | train_step_timing in s: 26.93 | consumed_samples: 6144 | TFLOPS_per_GPU: 85.8\n"
)

# ex-nemo1-launcher-55 (nemo1_progress_bar), verbatim from https://github.com/NVIDIA/NeMo-Framework-Launcher/issues/55
NEMO1_LAUNCHER_55 = """\
Epoch 0:   1%|          | 795/77225 [9:07:58<878:01:48, 41.36s/it, loss=3.1, v_num=, reduced_train_loss=3.090, global_step=794.0, consumed_samples=1.63e+6]
"""

# ex-args-mlm-495 (megatron_args_dump), verbatim from https://github.com/NVIDIA/Megatron-LM/issues/495
ARGS_MLM_495 = """\
      gradient_accumulation_fusion .................... True
      group_query_attention ........................... False
      head_lr_mult .................................... 1.0
      hidden_dropout .................................. 0.1
      hidden_size ..................................... 5120
      hysteresis ...................................... 2
      ict_head_size ................................... None
      ict_load ........................................ None
      img_h ........................................... 224
      img_w ........................................... 224
      indexer_batch_size .............................. 128
      indexer_log_interval ............................ 1000
      inference_batch_times_seqlen_threshold .......... 512
      init_method_std ................................. 0.02
      init_method_xavier_uniform ...................... False
      initial_loss_scale .............................. 4294967296
      iter_per_epoch .................................. 1250
      kv_channels ..................................... 128
      lazy_mpu_init ................................... None
      load ............................................ <LOAD_PATH>
      local_rank ...................................... None
"""

# ex-args-nccl-743 (megatron_args_dump), verbatim from https://github.com/NVIDIA/nccl/issues/743
ARGS_NCCL_743 = """\
  log_learning_rate_to_tensorboard ................ True
  log_loss_scale_to_tensorboard ................... True
  log_memory_to_tensorboard ....................... False
  log_num_zeros_in_grad ........................... False
  log_params_norm ................................. False
  log_timers_to_tensorboard ....................... False
  log_validation_ppl_to_tensorboard ............... False
  log_world_size_to_tensorboard ................... False
  loss_scale ...................................... None
  loss_scale_window ............................... 1000
  lr .............................................. 0.0001
  lr_decay_iters .................................. 990000
  lr_decay_samples ................................ None
  lr_decay_style .................................. linear
  lr_warmup_fraction .............................. 0.01
  lr_warmup_iters ................................. 0
  lr_warmup_samples ............................... 0
  make_vocab_size_divisible_by .................... 128
"""

# ex-args-local-v014-full (megatron_args_dump:reproduced_local), verbatim from https://github.com/NVIDIA/Megatron-LM/blob/23e00ed0963c35382dfe8a5a94fb3cda4d21e133/megatron/training/arguments.py
ARGS_LOCAL_V014_FULL = """\
using world size: 8, data-parallel size: 2, context-parallel size: 1, hierarchical context-parallel sizes: None, tensor-model-parallel size: 2, pipeline-model-parallel size: 2
WARNING: Setting args.overlap_p2p_comm and args.align_param_gather to False since non-interleaved schedule does not support overlapping p2p communication and aligned param AG
Number of virtual stages per pipeline stage: None
accumulate and all-reduce gradients in fp32 for bfloat16 data type.
using torch.bfloat16 for parameters ...
------------------------ arguments ------------------------
  account_for_embedding_in_pipeline_split ......... False
  account_for_loss_in_pipeline_split .............. False
  accumulate_allreduce_grads_in_fp32 .............. True
  ...
  distribute_saved_activations .................... False
  ...
  moe_layer_recompute ............................. False
  ...
  rampup_batch_size ............................... None
  rank ............................................ 0
  recompute_granularity ........................... full
  recompute_method ................................ uniform
  recompute_modules ............................... None
  recompute_num_layers ............................ 2
  record_memory_history ........................... False
  ...
  world_size ...................................... 8
  yaml_cfg ........................................ None
-------------------- end of arguments ---------------------
"""

# ckpt-local-grad-reentrant (checkpoint_error/grad_incompatible:reproduced_local), verbatim from reproduced with the public code on CPU (torch 2.14.1) (torch 2.14.1+cu130, CPU; output in exp/ckpt_errors.out)
CKPT_GRAD_REENTRANT = """\
RuntimeError: When use_reentrant=True, torch.utils.checkpoint is incompatible with .grad() or passing an `inputs` parameter to .backward(). To resolve this error, you can either set use_reentrant=False, or call .backward() without passing the `inputs` argument.
"""

# ckpt-local-no-input-grad (checkpoint_warning/no_input_requires_grad:reproduced_local), verbatim from reproduced with the public code on CPU (torch 2.14.1) (torch 2.14.1+cu130, CPU; output in exp/ckpt_errors.out)
CKPT_NO_INPUT_GRAD = """\
UserWarning: None of the inputs have requires_grad=True. Gradients will be None
RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn
"""

# ckpt-local-use-reentrant-missing (checkpoint_warning/use_reentrant_missing:reproduced_local), verbatim from reproduced with the public code on CPU (torch 2.14.1) (torch 2.14.1+cu130, CPU; output in exp/ckpt_errors.out)
CKPT_USE_REENTRANT_MISSING = """\
UserWarning: torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly. Starting in PyTorch 2.9, calling checkpoint without use_reentrant will raise an exception. use_reentrant=False is recommended, but if you need to preserve the current default behavior, you can pass use_reentrant=True. Refer to docs for more details on the differences between the two variants.
"""

# ckpt-local-metadata (checkpoint_error/metadata_mismatch:reproduced_local), verbatim from reproduced with the public code on CPU (torch 2.14.1) (torch 2.14.1+cu130, CPU; output in exp/ckpt_errors.out)
CKPT_METADATA = """\
torch.utils.checkpoint.CheckpointError: torch.utils.checkpoint: Recomputed values for the following tensors have different metadata than during the forward pass.
tensor at position 0:
saved metadata: {'shape': torch.Size([2, 4]), 'dtype': torch.float32, 'device': device(type='cpu')}
recomputed metadata: {'shape': torch.Size([2, 3]), 'dtype': torch.float32, 'device': device(type='cpu')}
tensor at position 1:
saved metadata: {'shape': torch.Size([2, 4]), 'dtype': torch.float32, 'device': device(type='cpu')}
recomputed metadata: {'shape': torch.Size([2, 3]), 'dtype': torch.float32, 'device': device(type='cpu')}
.

Tip: To see a more detailed error message, either pass `debug=True` to
`torch.utils.checkpoint.checkpoint(...)` or wrap the code block
with `with torch.utils.checkpoint.set_checkpoint_debug_enabled(True):` to
enable checkpoint‑debug mode globally.

If this error occurs under torch.compile with automatic_dynamic_shapes enabled,
it may be because the recomputation selected a different compiled graph than the
forward pass (e.g., a dynamic graph instead of the original static graph).
To fix this, either:
  - Use torch._dynamo.mark_dynamic() to explicitly mark varying dimensions as
    dynamic upfront, avoiding the static-to-dynamic transition.
  - Call torch._C._dynamo.eval_frame._set_lru_cache(False) to disable LRU cache
    reordering, which can change which graph is checked first between forward
    and recompute.
See https://github.com/pytorch/pytorch/issues/166926 for more details and
workaround examples.
"""

# ckpt-local-kwargs-reentrant (checkpoint_error/kwargs_reentrant:reproduced_local), verbatim from reproduced with the public code on CPU (torch 2.14.1) (torch 2.14.1+cu130, CPU; output in exp/ckpt_errors.out)
CKPT_KWARGS_REENTRANT = """\
ValueError: Unexpected keyword arguments: scale
"""

# ckpt-local-ddp (checkpoint_error/ddp_mark_ready_twice:reproduced_local), verbatim from reproduced with the public code on CPU (torch 2.14.1) (torch 2.14.1+cu130, CPU; output in exp/ckpt_errors.out)
CKPT_DDP = """\
RuntimeError: Expected to mark a variable ready only once. This error is caused by one of the following reasons: 1) Use of a module parameter outside the `forward` function. Please make sure model parameters are not shared across multiple concurrent forward-backward passes. or try to use _set_static_graph() as a workaround if this module graph does not change during training loop.2) Reused parameters in multiple reentrant backward passes. For example, if you use multiple `checkpoint` functions to wrap the same part of your model, it would result in the same set of parameters been used by different reentrant backward passes multiple times, and hence marking a variable ready multiple times. DDP does not support such use cases in default. You can try to use _set_static_graph() as a workaround if your module graph does not change over iterations.
Parameter at index 1 with name block.bias has been marked as ready twice. This means that multiple autograd engine  hooks have fired for this particular parameter during this iteration.
"""

# tc-measured-full-no-method (config_validation_case:measured_local), verbatim from https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/core/transformer/transformer_config.py#L1884-L2030
TC_FULL_NO_METHOD = """\
TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=4, recompute_granularity='full', recompute_num_layers=1)
core_v0.14.0 (23e00ed0): ValueError: Using recompute_granularity: full so recompute_method must be "block" or "uniform"
main (d98e8a64):         ValueError: Using recompute_granularity: full so recompute_method must be "block" or "uniform"
"""

# tc-measured-bad-granularity (config_validation_case:measured_local), verbatim from https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/core/transformer/transformer_config.py#L1884-L2030
TC_BAD_GRANULARITY = """\
TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=4, recompute_granularity='partial')
core_v0.14.0 (23e00ed0): ValueError: When using recompute_granuarlity: partial must be "full"or "selective".
main (d98e8a64):         ValueError: When using recompute_granuarlity: partial must be "full"or "selective".
"""

# tc-measured-selective-bad-module (config_validation_case:measured_local), verbatim from https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/core/transformer/transformer_config.py#L1884-L2030
TC_SELECTIVE_BAD_MODULE = """\
TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=4, recompute_granularity='selective', recompute_modules=['attention'])
core_v0.14.0 (23e00ed0): AssertionError: Invalid choices for recompute_modules: {'attention'}. Allowed modules are: {'mlp', 'shared_experts', 'mla_up_proj', 'core_attn', 'moe_act', 'layernorm', 'moe'}
main (d98e8a64):         AssertionError: Invalid choices for recompute_modules: {'attention'}. Allowed modules are: {'mla_up_proj', 'shared_experts', 'mhc', 'layernorm', 'core_attn', 'moe', 'gdp_in_proj', 'gdp_qkv', 'mlp', 'gdn_norm_out', 'moe_act'}
"""

# tc-measured-moe-layer-recompute-with-full (config_validation_case:measured_local), verbatim from https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/core/transformer/transformer_config.py#L1884-L2030
TC_MOE_LAYER_RECOMPUTE_WITH_FULL = """\
TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=4, moe_layer_recompute=True, recompute_granularity='full', recompute_method='uniform', recompute_num_layers=1)
core_v0.14.0 (23e00ed0): ValueError: Do not set --moe-layer-recompute with full recompute granularity.   [warnings: --moe-layer-recompute is deprecated. Use --recompute-granularity selective --recompute-modules moe_layer instead.]
main (d98e8a64):         ValueError: Do not set --moe-layer-recompute with full recompute granularity.   [warnings: --moe-layer-recompute is deprecated. Use --recompute-granularity selective --recompute-modules moe_layer instead.]
"""

# tc-measured-cpu-offload-with-recompute (config_validation_case:measured_local), verbatim from https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/core/transformer/transformer_config.py#L1884-L2030
TC_CPU_OFFLOAD_WITH_RECOMPUTE = """\
TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=4, cpu_offloading=True, cpu_offloading_num_layers=1, recompute_granularity='selective')
core_v0.14.0 (23e00ed0): ValueError: CPU offloading does not work when activation recomputation is enabled
main (d98e8a64):         ValueError: CPU offloading does not work when activation recomputation is enabled
"""

# =============================================================================================
# Verbatim text from the seeds (shared/seeds), each quoting its source
# =============================================================================================

# seeds/001_ef50205b3ce230ec.txt: NVIDIA agent skill "perf-activation-recompute"
# (npx skill4agent add nvidia/skills perf-activation-recompute); lines 24-29 verbatim, the header
# line still glued to the scraped text before it.
SEED_EXPERIMENT_TABLE = """\
...recompute_granularity=selectiverecompute_modulesrecompute_granularity=fullrecompute_methodrecompute_num_layersrecompute_granularity="full"recompute_num_layersattnmlpmoe_routerLLAMA3_70B_SFT_CONFIG_H100_FP8_CS_V1cuda_graph_impl="transformer_engine"cuda_graph_scope="mlp"recompute_granularity="selective"recompute_modulescuda_graph_impl="none"cuda_graph_impl="local"cuda_graph_scope="full_iteration"distribute_saved_activations=Truesequence_parallel=Truemlpcore_attnmlp| Experiment | recompute_modules | TFLOP/s/GPU | vs Golden | Peak Mem (GB) | Result |
|---|---|---|---|---|---|
| Baseline | [core_attn] | ~704 | -0.8% | 58.8 (OOM rank0) | OOM |
| Exp 1 | [mlp] | 593.6 | -16.4% | 55.6 | Perf regression |
| Exp 2 | [mlp, core_attn] | 586.8 | -17.3% | 55.6 | Perf regression |
| Exp 3 | [core_attn, layernorm] | ~702 | -1.1% | 59.6 (OOM rank0) | OOM |
"""
# The same skill page, lines 4-7, 12-20 and 43-49: its other tables (granularity, modules,
# symptoms), which are not experiment results and must not give rows.
SEED_OTHER_TABLES = """\
npx skill4agent add nvidia/skills perf-activation-recompute| Granularity | What you specify | What gets recomputed | Memory savings | Compute cost |
|---|---|---|---|---|
| | specific submodules within each layer | moderate (module-dependent) | low to high |
| | entire transformer layers (N layers) | strongest | highest |
cfg.model.recompute_num_layers = 4| Module | What it recomputes | Compute cost | Memory savings |
|---|---|---|---|
| attention softmax/dropout/QKV dot product | low (Flash Attention already recomputes internally) | moderate |
| layer normalization | negligible (~0%) | negligible |
| full FFN block | high (~16% on Llama3 70B, hidden=28672) | ~3 GB |
| MoE expert dispatch | varies | varies |
| MoE activation functions | low | small |
| shared expert layers | moderate | moderate |
| Multi-Latent Attention up projection | moderate | moderate |
)| Symptom | Cause | Confirm | Fix |
|---|---|---|---|
| >15% GPU utilization drop | mlp recompute on large FFN | check | check |
| Still OOM after adding layernorm | layernorm activations are too small | compare peak memory before/after | add mlp recompute or check |
| layer-level recompute ( | check | use submodule recompute ( |
| ValueError: PP + CPU offloading | | check PP config | disable CPU offloading or set PP=1 |
| mlp+core_attn worse than mlp alone | double recompute overhead | compare Exp 1 vs Exp 2 | use mlp alone |
"""
# seeds/001 lines 21-23 and the "..." that starts line 24: the skill's launch command.
SEED_BRIDGE_COMMAND = """\
python scripts/performance/run_performance_workload.py \\
--recompute_granularity selective \\
--recompute_modules core_attn layernorm \\
...
"""
# seeds/001 line 10 up to where the scrape glued the next snippet on, and line 11.
SEED_CFG_ASSIGNMENTS = """\
cfg.model.recompute_modules = ["core_attn", "layernorm"] # or ["mlp"] or ["mlp", "core_attn"]
cfg.model.recompute_method = "uniform"
"""
# seeds/001 lines 33-35: the recipe's "memory saving" defaults.
SEED_CFG_DEFAULTS = """\
cfg.model.recompute_granularity = None
cfg.model.recompute_modules = None
cfg.model.fine_grained_activation_offloading = False
"""
# seeds/000_5a61a636aa2f93e8.txt: Megatron Bridge docs, "Activation Recomputation" (two of its
# GPTModelProvider examples, verbatim).
SEED_PROVIDER_FULL = """\
model_config = GPTModelProvider(
    recompute_granularity="full",  # Enable full layer recomputation
    recompute_method="uniform",    # Uniform distribution across layers
    recompute_num_layers=4,        # Number of layers per recomputation block
    # ... other model parameters
)
"""
SEED_PROVIDER_MODULES = """\
model_config = GPTModelProvider(
    recompute_granularity="selective",
    recompute_modules=[
        "core_attn",      # Core attention computation (default)
        "mlp",            # MLP layers
        "layernorm",      # Layer normalization
        "moe",            # Mixture of Experts layers
        "moe_act",        # MoE activation functions
        "shared_experts", # Shared expert layers
        "mla_up_proj",    # Multi-Latent Attention up projection
    ],
)
"""

# =============================================================================================
# Real output of real code, produced on a GPU by tests/data/evidence/make_gpu_samples.py
# (PyTorch 2.11.0+cu130 on an NVIDIA H100 80GB HBM3)
# =============================================================================================

GPU_OOMS = {o["variant"]: o for o in json.loads((DATA / "cuda_oom.json").read_text())["ooms"]}


def strip_rank(message: str) -> str:
    """A real message without the rank prefix it was printed with."""
    return re.sub(r"^\[rank\d+\]: ", "", message.strip())


# Each real OOM message with the fields it prints (sizes as printed) and its generation.
OOM_CASES = {
    "gen1": (
        OOM_GEN1,
        "gen1_cached",
        dict(
            requested_bytes=nbytes(12.50, MiB),
            device=0,
            total_bytes=nbytes(10.92, GiB),
            allocated_bytes=nbytes(8.57, MiB),
            free_bytes=nbytes(9.28, GiB),
            # "cached" is what the allocator holds unallocated (amount_cached -
            # amount_allocated in the 1.x allocator), so the reserve is allocated + cached
            reserved_unallocated_bytes=nbytes(4.68, MiB),
            reserved_bytes=nbytes(8.57, MiB) + nbytes(4.68, MiB),
        ),
    ),
    "gen2": (
        OOM_GEN2,
        "gen2_reserved",
        dict(
            requested_bytes=nbytes(128.00, MiB),
            device=0,
            total_bytes=nbytes(11.17, GiB),
            allocated_bytes=nbytes(10.85, GiB),
            free_bytes=nbytes(24.81, MiB),
            reserved_bytes=nbytes(10.86, GiB),
            # "R reserved in total": what the allocator holds unhanded is R - A
            reserved_unallocated_bytes=nbytes(10.86, GiB) - nbytes(10.85, GiB),
        ),
    ),
    "gen3": (
        OOM_GEN3,
        "gen3_max_split",
        dict(
            requested_bytes=nbytes(786.00, MiB),
            device=0,
            total_bytes=nbytes(31.74, GiB),
            allocated_bytes=nbytes(28.82, GiB),
            free_bytes=nbytes(577.12, MiB),
            reserved_bytes=nbytes(29.97, GiB),
            reserved_unallocated_bytes=nbytes(29.97, GiB) - nbytes(28.82, GiB),
        ),
    ),
    "gen4": (
        OOM_GEN4,
        "gen4_capacty",
        dict(
            requested_bytes=nbytes(138.00, MiB),
            device=0,
            total_bytes=nbytes(15.90, GiB),
            free_bytes=nbytes(8.44, MiB),
            other_processes_bytes=nbytes(577.00, MiB),
            process_bytes=nbytes(15.32, GiB),
            allocated_bytes=nbytes(14.12, GiB),
            reserved_unallocated_bytes=nbytes(410.41, MiB),
        ),
    ),
    "gen5": (
        OOM_GEN5,
        "gen5_expandable",
        dict(
            requested_bytes=nbytes(22.00, MiB),
            device=0,
            total_bytes=nbytes(23.65, GiB),
            free_bytes=nbytes(11.06, MiB),
            process_bytes=nbytes(23.60, GiB),
            allocated_bytes=nbytes(22.90, GiB),
            reserved_unallocated_bytes=nbytes(194.87, MiB),
        ),
    ),
    "gen6": (
        OOM_GEN6,
        "gen6_pytorch_alloc_conf",
        dict(
            rank=97,
            requested_bytes=nbytes(48.00, MiB),
            device=1,
            total_bytes=nbytes(139.81, GiB),
            free_bytes=nbytes(22.44, MiB),
            process_bytes=nbytes(139.78, GiB),
            allocated_bytes=nbytes(138.20, GiB),
            reserved_unallocated_bytes=nbytes(40.42, MiB),
        ),
    ),
    # torch 2.11 prints the newer docs.pytorch.org URL
    "gen7_plain": (
        GPU_OOMS["plain"]["traceback"],
        "gen7_docs_url",
        dict(
            requested_bytes=nbytes(1024.00, GiB),
            device=0,
            total_bytes=nbytes(79.18, GiB),
            free_bytes=nbytes(78.43, GiB),
            process_bytes=nbytes(760.00, MiB),
            allocated_bytes=nbytes(73.00, MiB),
            reserved_unallocated_bytes=nbytes(7.00, MiB),
        ),
    ),
    "gen7_allowed": (
        GPU_OOMS["allowed"]["traceback"],
        "gen7_docs_url",
        dict(
            requested_bytes=nbytes(3.96, GiB),
            device=0,
            total_bytes=nbytes(79.18, GiB),
            free_bytes=nbytes(78.43, GiB),
            process_bytes=nbytes(760.00, MiB),
            allowed_bytes=nbytes(810.79, MiB),
            allocated_bytes=nbytes(73.00, MiB),
            reserved_unallocated_bytes=nbytes(7.00, MiB),
        ),
    ),
    "gen7_private_pool": (
        GPU_OOMS["private_pool"]["traceback"],
        "gen7_docs_url",
        dict(
            requested_bytes=nbytes(1024.00, GiB),
            device=0,
            total_bytes=nbytes(79.18, GiB),
            free_bytes=nbytes(78.39, GiB),
            process_bytes=nbytes(794.00, MiB),
            allocated_bytes=nbytes(105.00, MiB),
            private_pool_bytes=nbytes(32.00, MiB),
            reserved_unallocated_bytes=nbytes(9.00, MiB),
        ),
    ),
}
OOM_FIELDS = [
    "requested_bytes",
    "total_bytes",
    "free_bytes",
    "allocated_bytes",
    "reserved_unallocated_bytes",
    "process_bytes",
    "other_processes_bytes",
    "reserved_bytes",
    "allowed_bytes",
    "private_pool_bytes",
    "device",
]
# The message lines alone (for the noise tests): the exception line of the GPU tracebacks.
OOM_MESSAGES = {
    name: strip_rank(text) if not name.startswith("gen7") else text.strip().splitlines()[-1]
    for name, (text, _, _) in OOM_CASES.items()
}


def check_oom(event: OOMEvent, generation: str, expected: dict) -> None:
    assert event.generation == generation
    for name in OOM_FIELDS:
        if name in expected:
            assert getattr(event, name) == expected[name], name
        elif name not in ("device",):
            assert getattr(event, name) is None, name
    if "rank" in expected:
        assert event.rank == expected["rank"]
    assert not event.truncated


def all_parsers(text: str) -> None:
    """Every parser on `text`: each returns its type and none raises."""
    assert isinstance(parse_log(text), Evidence)
    assert isinstance(parse_oom(text), list)
    assert isinstance(parse_config(text), dict)
    assert isinstance(parse_experiments(text), list)
    stats = parse_memory_stats(text)
    assert stats is None or isinstance(stats, dict)
    assert isinstance(clean_line(text), str)
