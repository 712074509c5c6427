# ruff: noqa: E501  (verbatim log lines are longer than 100 characters and must stay whole)
"""Tests for recompute_kit.doctor.evidence.

Every parser input below is real text: verbatim blocks from shared/reference/real-formats.md and
the seeds (each with the URL its block names), output of the real PyTorch code run here or on a
GPU (tests/data/evidence, made by make_gpu_samples.py), or lines printed by running the quoted
Megatron/NeMo format code. The only changes made to real text are noise: rank prefixes, ANSI
colours, timestamps, hard wraps and truncation.
"""

from __future__ import annotations

import json
import pickle
import re
import textwrap
import time
import traceback
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recompute_kit.doctor.evidence import (
    ErrorEvent,
    Evidence,
    EvidenceError,
    Iteration,
    OOMEvent,
    clean_line,
    collect,
    load_snapshot,
    parse_config,
    parse_config_with_notes,
    parse_experiments,
    parse_log,
    parse_log_file,
    parse_memory_stats,
    parse_oom,
    parse_size,
    summarize_snapshot,
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


# =============================================================================================
# Sizes and line cleaning
# =============================================================================================


@pytest.mark.parametrize(
    ("text", "unit", "expected"),
    [
        ("12.50 MiB", None, 13107200),
        ("10.92 GiB", None, round(10.92 * GiB)),
        ("512 bytes", None, 512),
        ("1.5 KiB", None, 1536),
        ("3 GB", None, 3_000_000_000),
        ("58.8", "GB", 58_800_000_000),
        ("58.8 (OOM rank0)", "GB", 58_800_000_000),
        ("0 bytes", None, 0),
        ("1024.00 GiB", None, 1024 * GiB),
        ("58.8", None, None),
        ("twelve MiB", None, None),
        ("12 apples", None, None),
        ("", None, None),
        ("-1 GiB", None, None),
    ],
)
def test_parse_size(text, unit, expected):
    assert parse_size(text, unit) == expected


def test_clean_line_strips_noise_but_keeps_indentation():
    # ex-mlm-756-iters (https://github.com/NVIDIA/Megatron-LM/issues/756): timestamp prefix
    line = MLM_756_ITERS.splitlines()[0]
    assert clean_line(line).startswith("iteration       71/     100 |")
    # oom-msswift-9191 (https://github.com/modelscope/ms-swift/issues/9191): [rank97]:
    assert clean_line(OOM_GEN6.strip()).startswith("torch.OutOfMemoryError: CUDA out")
    # ex-nemo-14850 (https://github.com/NVIDIA-NeMo/Speech/issues/14850): srun's " 0: "
    assert clean_line(NEMO_14850.splitlines()[0]).startswith("Training epoch 0, iteration 8/29")
    assert clean_line(NEMO_14850.splitlines()[1]) == ""
    # noise: ANSI colours, torchrun's [default0]:, NeMo's logging prefix, ISO timestamps
    assert clean_line("\x1b[1;31m" + OOM_MESSAGES["gen5"] + "\x1b[0m") == OOM_MESSAGES["gen5"]
    assert clean_line("[default3]:[rank3]: " + OOM_MESSAGES["gen1"]) == OOM_MESSAGES["gen1"]
    stamp = "[NeMo I 2025-01-01 12:00:00 nemo_logging:393] "
    assert clean_line(stamp + OOM_MESSAGES["gen2"]) == OOM_MESSAGES["gen2"]
    assert clean_line("2025-01-01 12:00:00.123 " + OOM_MESSAGES["gen2"]) == OOM_MESSAGES["gen2"]
    assert clean_line("[2025-01-01 12:00:00,123] " + OOM_MESSAGES["gen2"]) == OOM_MESSAGES["gen2"]
    # ex-args-nccl-743 (https://github.com/NVIDIA/nccl/issues/743): indentation survives
    arg = ARGS_NCCL_743.splitlines()[0]
    assert clean_line("[rank0]: " + arg) == arg


# =============================================================================================
# Out-of-memory messages
# =============================================================================================


@pytest.mark.parametrize("name", list(OOM_CASES))
def test_oom_every_generation(name):
    """Sources: gen1 https://github.com/pytorch/pytorch/issues/16417 (title), gen2
    https://github.com/microsoft/unilm/issues/137, gen3
    https://github.com/NVIDIA/Megatron-LM/issues/525, gen4
    https://github.com/pytorch/pytorch/pull/99699 (hard-wrapped as posted), gen5
    https://github.com/pytorch/pytorch/issues/16417 (comment), gen6
    https://github.com/modelscope/ms-swift/issues/9191, gen7: real tracebacks from torch 2.11."""
    text, generation, expected = OOM_CASES[name]
    events = parse_oom(text)
    assert len(events) == 1
    check_oom(events[0], generation, expected)
    assert "out of memory" in events[0].line


def test_oom_exception_prefixes_and_line():
    # gen1/gen2 print RuntimeError, gen3/gen4 torch.cuda.OutOfMemoryError, gen6 torch.OutOfMemoryError
    assert parse_oom(OOM_GEN1)[0].line.startswith("RuntimeError: CUDA out of memory.")
    assert parse_oom(OOM_GEN3)[0].line.startswith("torch.cuda.OutOfMemoryError: CUDA out")
    assert parse_oom(OOM_GEN6)[0].line.startswith("torch.OutOfMemoryError: CUDA out")
    # the message alone, without any exception type
    bare = OOM_MESSAGES["gen5"].split(": ", 1)[1]
    check_oom(parse_oom(bare)[0], *OOM_CASES["gen5"][1:])


def test_oom_gen7_traceback_gives_error_event_with_frame():
    # real traceback of torch 2.11 (tests/data/evidence/cuda_oom.json, variant "plain")
    evidence = parse_log(GPU_OOMS["plain"]["traceback"])
    assert len(evidence.oom) == 1
    (error,) = evidence.errors
    assert error.type == "torch.OutOfMemoryError" == GPU_OOMS["plain"]["type"]
    assert error.message == GPU_OOMS["plain"]["message"]
    assert len(error.frames) == 1 and error.frames[0].endswith("make_gpu_samples.py:28 in _oom")


def test_oom_hip_same_format():
    # ROCm builds print the same allocator message, hipified (CUDA -> HIP in the text and the
    # env var). No verbatim ROCm text is in the references: the real gen5 message is
    # hipified here the way the ROCm build does it.
    hip = OOM_MESSAGES["gen5"].replace("CUDA out of memory", "HIP out of memory")
    hip = hip.replace("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
    (event,) = parse_oom("[rank2]: " + hip)
    assert event.backend == "hip" and event.rank == 2
    check_oom(event, "gen5_expandable", OOM_CASES["gen5"][2])
    assert parse_oom(OOM_GEN5)[0].backend == "cuda"


def test_oom_outside_the_caching_allocator_and_launcher_prefixes():
    """Real lines quoted verbatim in the doctor's scenario cases (tests/scenarios/*.yaml; each
    case's `why` says so), from the public threads named below."""
    # https://github.com/nvidia-cosmos/cosmos-rl/pull/731: NCCL's own cudaMalloc fails
    nccl = (
        "include/alloc.h:228 NCCL WARN Cuda failure 2 'out of memory'\n"
        "ncclUnhandledCudaError: Call to CUDA function failed.\n"
    )
    evidence = parse_log(nccl)
    assert [o.generation for o in evidence.oom] == ["nccl_cuda_failure"]
    assert not evidence.oom[0].truncated
    assert [e.type for e in evidence.errors] == ["ncclUnhandledCudaError"]
    # https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/3767: a Triton kernel launch
    (oom,) = parse_oom("[rank52]: RuntimeError: Triton Error [CUDA]: out of memory")
    assert (oom.generation, oom.rank, oom.truncated) == ("triton_cuda", 52, False)
    # https://github.com/chnsh/DCRNN_PyTorch/issues/6: no space after "RuntimeError:"
    text = (
        "RuntimeError:CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 5.80 GiB total "
        "capacity; 4.36 GiB already allocated; 6.69 MiB free; 4.63 GiB reserved in total by "
        "PyTorch)"
    )
    evidence = parse_log(text)
    check_oom(
        evidence.oom[0],
        "gen2_reserved",
        dict(
            requested_bytes=nbytes(20.00, MiB),
            device=0,
            total_bytes=nbytes(5.80, GiB),
            allocated_bytes=nbytes(4.36, GiB),
            free_bytes=nbytes(6.69, MiB),
            reserved_bytes=nbytes(4.63, GiB),
        ),
    )
    assert [e.type for e in evidence.errors] == ["RuntimeError"]
    # https://github.com/hiyouga/LlamaFactory/issues/747: DeepSpeed's pdsh prefixes every line
    # with the host; a (noise) gen6 OOM between its verbatim lines stays one record
    deepspeed = [
        "192.168.0.32: /mnt/anaconda/envs/llama_etuning/lib/python3.10/site-packages/transformers/optimization.py:411: FutureWarning: This implementation of AdamW is deprecated and will be removed in a future version. Use the PyTorch implementation torch.optim.AdamW instead, or set `no_deprecation_warning=True` to disable this warning",
        "192.168.0.32:   warnings.warn(",
        "192.168.0.32: " + OOM_MESSAGES["gen6"][:75],
        "192.168.0.32: [2023-08-31 11:58:27,249] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 1612505",
    ]
    evidence = parse_log("\n".join(deepspeed))
    (oom,) = evidence.oom
    assert oom.requested_bytes == nbytes(48.00, MiB) and oom.truncated
    assert "Killing" not in oom.line
    (warning, error) = evidence.errors
    assert (warning.type, warning.frames) == (
        "FutureWarning",
        [
            "/mnt/anaconda/envs/llama_etuning/lib/python3.10/site-packages/transformers/optimization.py:411"
        ],
    )
    assert error.type == "torch.OutOfMemoryError"


NOISES = {
    "rank_prefix": lambda m: "[rank3]: " + m,
    "srun_prefix": lambda m: " 3: " + m,
    "ansi": lambda m: "\x1b[31m" + m.replace(": CUDA", "\x1b[0m: \x1b[1mCUDA", 1) + "\x1b[0m",
    "timestamp": lambda m: "[2025-01-01 12:00:00,123] [rank3]: " + m,
    "wrap80_columns": lambda m: "\n".join(m[i : i + 80] for i in range(0, len(m), 80)),
    "wrap80_words": lambda m: "\n".join(textwrap.wrap(m, 80)),
    "wrap80_each_line_prefixed": lambda m: "\n".join(
        "[rank3]: " + m[i : i + 80] for i in range(0, len(m), 80)
    ),
    "wrap40_ansi_in_log": lambda m: (
        MLM_756_ITERS.splitlines()[0]
        + "\n\x1b[31m"
        + "\n".join(textwrap.wrap(m, 40))
        + "\x1b[0m\n"
        + MLM_756_ITERS.splitlines()[1]
    ),
    "crlf_wrap": lambda m: "\r\n".join(textwrap.wrap(m, 70)) + "\r\n",
}


@pytest.mark.parametrize("noise", list(NOISES))
@pytest.mark.parametrize("name", list(OOM_CASES))
def test_oom_with_noise(name, noise):
    _, generation, expected = OOM_CASES[name]
    text = NOISES[noise](OOM_MESSAGES[name])
    events = parse_oom(text)
    assert len(events) == 1, text
    expected = {k: v for k, v in expected.items() if k != "rank"}
    check_oom(events[0], generation, expected)
    if "rank" in noise or "prefixed" in noise or "srun" in noise or "timestamp" in noise:
        assert events[0].rank == 3


@pytest.mark.parametrize("name", list(OOM_CASES))
def test_oom_truncated_at_every_position(name):
    """A message cut anywhere: no parser raises, and every field parse_oom gives is the full
    message's value."""
    message = OOM_MESSAGES[name]
    full = parse_oom(message)[0]
    for cut in range(len(message)):
        _all_parsers(message[:cut])
        events = parse_oom(message[:cut])
        assert len(events) <= 1
        for event in events:
            for field in OOM_FIELDS:
                value = getattr(event, field)
                assert value is None or value == getattr(full, field), (cut, field)
            if cut < len(message) * 0.5:
                assert event.truncated


def test_oom_truncated_then_next_record():
    # a cut message followed by a log line: the OOM keeps its partial fields, the line is read
    cut = OOM_MESSAGES["gen6"][:120]
    assert cut.endswith("139.81 GiB of whi")
    evidence = parse_log(cut + "\n" + MLM_756_ITERS)
    assert len(evidence.oom) == 1 and evidence.oom[0].truncated
    assert evidence.oom[0].requested_bytes == nbytes(48.00, MiB)
    assert evidence.oom[0].total_bytes == nbytes(139.81, GiB)
    assert evidence.oom[0].free_bytes is None
    assert [it.iteration for it in evidence.iterations] == [71, 72, 73]
    assert any("truncated" in note for note in evidence.notes)


def test_oom_many_ranks_interleaved():
    # noise: the gen6 message printed by four ranks, lines interleaved
    lines = [f"[rank{r}]: " + OOM_MESSAGES["gen6"] for r in (5, 1, 7, 3)]
    events = parse_oom("\n".join(lines))
    assert [e.rank for e in events] == [5, 1, 7, 3]
    assert {e.requested_bytes for e in events} == {nbytes(48.00, MiB)}


def test_oom_advice_is_not_an_env_setting():
    # the gen5/gen6 messages *advise* PYTORCH_CUDA_ALLOC_CONF=...; that is not a setting seen
    assert parse_log(OOM_GEN5 + OOM_GEN6).env == {}
    # seeds/001 mentions the setting as text: it is recorded
    evidence = parse_log("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert evidence.env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


# =============================================================================================
# Training logs: iterations, memory reports, argument dumps
# =============================================================================================


def test_megatron_iteration_lines():
    # ex-mlm-756-iters: https://github.com/NVIDIA/Megatron-LM/issues/756
    its = parse_log(MLM_756_ITERS).iterations
    assert [(i.iteration, i.total_iterations) for i in its] == [(71, 100), (72, 100), (73, 100)]
    assert [i.elapsed_ms for i in its] == [5361.6, 5470.7, 5829.9]
    assert [i.tflops_per_gpu for i in its] == [243.6, 238.7, 224.0]
    assert [i.loss for i in its] == [1.818812, 1.820313, 1.798953]
    assert its[0].learning_rate == 1.42e-05 and its[0].global_batch_size == 128
    assert its[0].grad_norm == 1.3 and its[0].source == "megatron"


def test_megatron_memory_report_in_mib():
    # ex-mlm-756-memory: https://github.com/NVIDIA/Megatron-LM/issues/756 (v0.x format,
    # unrounded). Megatron divides by 1024*1024 although it prints "MB".
    evidence = parse_log(MLM_756_MEMORY)
    (report,) = evidence.memory
    assert report.rank == 1 and report.iteration == 1 and report.label == "(after 1 iterations)"
    assert report.allocated_bytes == nbytes(54250.97802734375, MiB)
    assert report.max_allocated_bytes == nbytes(54250.98583984375, MiB)
    assert report.reserved_bytes == report.max_reserved_bytes == nbytes(61480.0, MiB)
    assert [i.iteration for i in evidence.iterations] == [2, 3]


def test_megatron_main_iteration_and_memory():
    # ex-mlm-pr5662: https://github.com/NVIDIA/Megatron-LM/pull/5662 (microsecond timestamp,
    # no throughput field, report_memory with 2 decimals)
    evidence = parse_log(MLM_PR5662)
    (it,) = evidence.iterations
    assert (it.iteration, it.elapsed_ms, it.tflops_per_gpu, it.loss) == (20, 744.0, None, 1.020935)
    (report,) = evidence.memory
    assert (report.rank, report.iteration) == (0, 20)
    assert report.allocated_bytes == nbytes(3270.16, MiB)
    assert report.max_allocated_bytes == nbytes(5670.39, MiB)
    assert report.max_reserved_bytes == nbytes(6406.00, MiB)


def test_megatron_bridge_hard_wrapped_log_and_step_time():
    # ex-mb-pr841: https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/841, pasted hard-wrapped
    # (words cut: "number of s / kipped", "max alloca / ted")
    evidence = parse_log(MB_PR841)
    its = evidence.iterations
    assert [i.iteration for i in its] == [10, 20]
    assert [i.elapsed_ms for i in its] == [13212.7, 14260.3]
    assert [i.loss for i in its] == [4.474437, 0.08797448]
    assert [i.global_batch_size for i in its] == [512, 512]
    # "Step Time : 14.26s GPU utilization: 58.2TFLOP/s/GPU" belongs to iteration 20
    assert its[1].tflops_per_gpu == 58.2 and its[1].source == "megatron-bridge"
    assert its[0].tflops_per_gpu is None
    (report,) = evidence.memory
    assert report.allocated_bytes == nbytes(11908.05029296875, MiB)
    assert report.max_allocated_bytes == nbytes(12712.43603515625, MiB)
    assert report.reserved_bytes == report.max_reserved_bytes == nbytes(12954.0, MiB)


def test_megatron_bridge_step_time_alone():
    # ex-mb-pr388: https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/388
    (it,) = parse_log(MB_PR388).iterations
    assert (it.iteration, it.elapsed_ms, it.tflops_per_gpu) == (None, 12780.0, 528.1)
    assert it.source == "megatron-bridge"


def test_megatron_bridge_memory_report_in_gb():
    """fmt-mb-training-log (https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/067f987df03b8355b03192d88d70f1709fedf51a/src/megatron/bridge/training/utils/train_utils.py#L1048-L1158):
    the line printed by running its format code on a real memory_stats() (H100)."""
    memory_keys = {  # MEMORY_KEYS, verbatim
        "allocated_bytes.all.current": "mem-allocated-bytes",
        "active_bytes.all.current": "mem-active-bytes",
        "inactive_split_bytes.all.current": "mem-inactive-bytes",
        "reserved_bytes.all.current": "mem-reserved-bytes",
        "allocated_bytes.all.peak": "mem-max-allocated-bytes",
        "active_bytes.all.peak": "mem-max-active-bytes",
        "inactive_split_bytes.all.peak": "mem-max-inactive-bytes",
        "reserved_bytes.all.peak": "mem-max-reserved-bytes",
        "num_alloc_retries": "mem-alloc-retires",
        "allocation.all.current": "mem-allocated-count",
    }
    stats = json.loads((DATA / "memory_stats.json").read_text())
    report = {}  # report_memory(): bytes/1.0e9 to 5 significant digits, 'bytes' -> 'gigabytes'
    for key, name in memory_keys.items():
        if name.endswith("-bytes"):
            report[name.replace("bytes", "gigabytes")] = float(f"{stats[key] / 1.0e9:.5g}")
        else:
            report[name] = stats[key]
    iteration = 10
    memory_string = f"(after {iteration} iterations) memory (GB)"
    for metric, value in report.items():
        memory_string += f" | {metric}: {value}"
    line = "[Rank {}] {}".format(0, memory_string)  # noqa: UP032 - the format code, verbatim

    (mem,) = parse_log(line).memory
    assert mem.source == "megatron-bridge" and mem.iteration == 10 and mem.rank == 0
    gb = report["mem-allocated-gigabytes"]
    assert mem.allocated_bytes == round(gb * 1e9)
    assert abs(mem.allocated_bytes - stats["allocated_bytes.all.current"]) < 1e-4 * 1e9
    assert mem.max_reserved_bytes == round(report["mem-max-reserved-gigabytes"] * 1e9)
    assert mem.inactive_bytes == round(report["mem-inactive-gigabytes"] * 1e9)
    assert mem.alloc_retries == stats["num_alloc_retries"] == 3


def test_megatron_main_memory_report_with_device_memory():
    """fmt-mlm-report-memory-main (https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/training/utils/common_utils.py#L313-L335):
    its format code run with log_device_memory_used on real memory_stats() numbers."""
    stats = json.loads((DATA / "memory_stats.json").read_text())
    mega_bytes = 1024.0 * 1024.0
    string = "(after 5 iterations)" + " memory (MB)"
    string += f" | allocated: {stats['allocated_bytes.all.current'] / mega_bytes:.2f}"
    string += f" | max allocated: {stats['allocated_bytes.all.peak'] / mega_bytes:.2f}"
    string += f" | reserved: {stats['reserved_bytes.all.current'] / mega_bytes:.2f}"
    string += f" | max reserved: {stats['reserved_bytes.all.peak'] / mega_bytes:.2f}"
    string += f" | total device memory used: {812 * 2**20 / mega_bytes:.2f}"
    line = "[Rank {}] {}".format(3, string)  # noqa: UP032 - the format code, verbatim
    (mem,) = parse_log(line).memory
    assert mem.rank == 3 and mem.iteration == 5
    printed = float(f"{stats['allocated_bytes.all.current'] / mega_bytes:.2f}")
    assert mem.allocated_bytes == nbytes(printed, MiB)
    assert mem.device_used_bytes == 812 * 2**20


def test_megatron_theoretical_memory_and_bridge_progress_log():
    """fmt-mlm-theoretical-memory-main (https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/training/theoretical_memory_usage.py#L456-L486)
    and fmt-mb-progress-log (https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/067f987df03b8355b03192d88d70f1709fedf51a/src/megatron/bridge/training/train.py#L1237-L1280),
    each printed by its format code."""
    weight_and_optimizer_memory, activation_memory = 18432.5, 30123.25
    total_memory = weight_and_optimizer_memory + activation_memory
    theory = (
        f"Theoretical memory footprints: weight and optimizer={weight_and_optimizer_memory:.2f} MB, "
        f"activation={activation_memory:.2f} MB, total={total_memory:.2f} MB\n"
    )
    saved_ckpt_prefix, step = "Saved checkpoint", 100
    job_throughput, cumulative_throughput = 512.34, 498.0
    num_floating_point_operations_so_far, tokens_so_far = 1.2e18, 3.4e9
    progress = (
        f"{saved_ckpt_prefix}\tIteration: {step}\t"
        f"Job throughput: {job_throughput:.1f} MODEL_TFLOP/s/GPU\t"
        f"Cumulative throughput: {cumulative_throughput:.1f} MODEL_TFLOP/s/GPU\t"
        f"Floating-point operations: {num_floating_point_operations_so_far:.2e}\t"
        f"Tokens (in billions): {tokens_so_far / 10**9:.2f}"
    )
    evidence = parse_log(theory + progress)
    assert evidence.theoretical_memory == {
        "weight_and_optimizer_bytes": int(18432.50 * MiB),
        "activation_bytes": int(30123.25 * MiB),
        "total_bytes": int(48555.75 * MiB),
    }
    (it,) = evidence.iterations
    assert (it.iteration, it.tflops_per_gpu, it.source) == (100, 512.3, "megatron-bridge")


def test_nemo2_progress_lines():
    # ex-nemo-14850: https://github.com/NVIDIA-NeMo/Speech/issues/14850 (srun " 0: " prefixes)
    evidence = parse_log(NEMO_14850)
    its = evidence.iterations
    assert [i.iteration for i in its] == [8, 9, 10, 11]
    assert {i.total_iterations for i in its} == {29}
    assert [i.elapsed_ms for i in its] == [27010.0, 27880.0, 26630.0, 26930.0]
    assert [i.tflops_per_gpu for i in its] == [48.58, 85.8, 85.8, 85.8]
    assert [i.loss for i in its] == [10.22, 10.1, 10.06, 9.924]
    assert its[0].max_memory_reserved_bytes == 57466159104
    assert its[3].max_memory_reserved_bytes == 57675874304
    assert {i.source for i in its} == {"nemo"}
    # a memory report each time the peak changes
    assert [(m.iteration, m.max_reserved_bytes) for m in evidence.memory] == [
        (8, 57466159104),
        (11, 57675874304),
    ]


def test_nemo1_progress_bar():
    # ex-nemo1-launcher-55: https://github.com/NVIDIA/NeMo-Framework-Launcher/issues/55
    (it,) = parse_log(NEMO1_LAUNCHER_55).iterations
    assert (it.iteration, it.total_iterations, it.elapsed_ms, it.loss) == (
        795,
        77225,
        41360.0,
        3.09,
    )


def test_argument_dump_with_header_and_world_sizes():
    # ex-args-local-v014-full: Megatron-LM core_v0.14.0 arguments.py, reproduced
    # (https://github.com/NVIDIA/Megatron-LM/blob/23e00ed0963c35382dfe8a5a94fb3cda4d21e133/megatron/training/arguments.py)
    evidence = parse_log(ARGS_LOCAL_V014_FULL)
    config = evidence.config
    assert config["recompute_granularity"] == "full"
    assert config["recompute_method"] == "uniform"
    assert config["recompute_num_layers"] == 2
    assert config["recompute_modules"] is None
    assert config["distribute_saved_activations"] is False
    assert config["moe_layer_recompute"] is False
    assert config["world_size"] == 8 and config["rank"] == 0 and config["yaml_cfg"] is None
    # from "using world size: 8, data-parallel size: 2, ..."
    assert config["data_parallel_size"] == 2
    assert config["tensor_model_parallel_size"] == 2
    assert config["pipeline_model_parallel_size"] == 2
    assert config["context_parallel_size"] == 1
    (warning,) = evidence.errors
    assert (warning.kind, warning.type) == ("warning", "WARNING")
    assert warning.message.startswith("Setting args.overlap_p2p_comm and args.align_param_gather")


def test_argument_dump_printed_by_megatron_code(capsys):
    """fmt-mlm-print-args-main (https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/training/arguments.py#L1990-L2001):
    _print_args run verbatim (is_rank0 stubbed) on Megatron argument names; a name of 48
    characters or more gets no dots."""
    import argparse
    import enum

    class AttnBackend(enum.Enum):  # megatron.core.transformer.enums.AttnBackend
        flash = 1
        fused = 2
        unfused = 3
        local = 4
        auto = 5

    def is_rank0():
        return True

    def _print_args(title, args):
        """Print arguments."""
        if is_rank0():
            print(f"------------------------ {title} ------------------------", flush=True)
            str_list = []
            for arg in vars(args):
                dots = "." * (48 - len(arg))
                str_list.append("  {} {} {}".format(arg, dots, getattr(args, arg)))  # noqa: UP032 - verbatim
            for arg in sorted(str_list, key=lambda x: x.lower()):
                print(arg, flush=True)
            print(f"-------------------- end of {title} ---------------------", flush=True)

    args = argparse.Namespace(
        recompute_granularity="selective",
        recompute_modules=["core_attn", "mlp"],
        recompute_num_layers=None,
        num_experts=64,
        attention_backend=AttnBackend.auto,
        num_microbatches_with_partial_activation_checkpoints=None,
        lr=0.00015,
    )
    _print_args("arguments", args)
    config = parse_log(capsys.readouterr().out).config
    assert config == {
        "recompute_granularity": "selective",
        "recompute_modules": ["core_attn", "mlp"],
        "recompute_num_layers": None,
        "num_moe_experts": 64,
        "attention_backend": "auto",
        "num_microbatches_with_partial_activation_checkpoints": None,
        "lr": 0.00015,
    }


def test_argument_dump_fragments_without_header():
    # ex-args-mlm-495 (https://github.com/NVIDIA/Megatron-LM/issues/495), 6-space indent
    config = parse_log(ARGS_MLM_495).config
    assert config["hidden_size"] == 5120 and config["kv_channels"] == 128
    assert config["init_method_std"] == 0.02 and config["hidden_dropout"] == 0.1
    assert config["initial_loss_scale"] == 4294967296
    assert config["group_query_attention"] is False and config["lazy_mpu_init"] is None
    assert config["load"] == "<LOAD_PATH>"
    # ex-args-nccl-743 (https://github.com/NVIDIA/nccl/issues/743)
    config = parse_log(ARGS_NCCL_743).config
    assert config["lr"] == 0.0001 and config["lr_decay_style"] == "linear"
    assert config["loss_scale"] is None and config["lr_warmup_fraction"] == 0.01
    assert len(config) == len(ARGS_NCCL_743.splitlines())


# =============================================================================================
# Exceptions, tracebacks and warnings
# =============================================================================================

CKPT_CASES = [
    # (block, [(kind, type, message start)])
    (
        CKPT_GRAD_REENTRANT,
        [("exception", "RuntimeError", "When use_reentrant=True, torch.utils.checkpoint is")],
    ),
    (
        CKPT_NO_INPUT_GRAD,
        [
            ("warning", "UserWarning", "None of the inputs have requires_grad=True."),
            ("exception", "RuntimeError", "element 0 of tensors does not require grad"),
        ],
    ),
    (
        CKPT_USE_REENTRANT_MISSING,
        [("warning", "UserWarning", "torch.utils.checkpoint: the use_reentrant parameter")],
    ),
    (
        CKPT_METADATA,
        [
            (
                "exception",
                "torch.utils.checkpoint.CheckpointError",
                "torch.utils.checkpoint: Recomputed values for the following tensors have "
                "different metadata",
            )
        ],
    ),
    (CKPT_KWARGS_REENTRANT, [("exception", "ValueError", "Unexpected keyword arguments: scale")]),
    (CKPT_DDP, [("exception", "RuntimeError", "Expected to mark a variable ready only once.")]),
]


@pytest.mark.parametrize(("block", "expected"), CKPT_CASES)
def test_checkpoint_errors_and_warnings(block, expected):
    # ckpt-local-*: reproduced with the public PyTorch code on CPU (real-formats.md)
    errors = parse_log(block).errors
    got = [
        (e.kind, e.type, e.message[: len(m)])
        for e, (_, _, m) in zip(errors, expected, strict=False)
    ]
    assert got == expected
    assert len(errors) == len(expected)


def test_checkpoint_metadata_error_keeps_its_details():
    # ckpt-local-metadata: the message continues over lines until the blank line
    (error,) = parse_log(CKPT_METADATA).errors
    assert error.details.splitlines()[0] == "tensor at position 0:"
    assert "recomputed metadata: {'shape': torch.Size([2, 3])" in error.details
    assert "Tip:" not in error.details
    # the DDP error's second line
    (error,) = parse_log(CKPT_DDP).errors
    assert error.details.startswith("Parameter at index 1 with name block.bias")


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        (
            TC_FULL_NO_METHOD,
            [
                (
                    "ValueError",
                    'Using recompute_granularity: full so recompute_method must be "block" or "uniform"',
                    2,
                )
            ],
        ),
        (
            TC_BAD_GRANULARITY,
            [
                (
                    "ValueError",
                    'When using recompute_granuarlity: partial must be "full"or "selective".',
                    2,
                )
            ],
        ),
        (
            TC_CPU_OFFLOAD_WITH_RECOMPUTE,
            [
                (
                    "ValueError",
                    "CPU offloading does not work when activation recomputation is enabled",
                    2,
                )
            ],
        ),
        (
            TC_SELECTIVE_BAD_MODULE,
            [
                (
                    "AssertionError",
                    "Invalid choices for recompute_modules: {'attention'}. Allowed modules are: {'mlp', 'shared_experts', 'mla_up_proj', 'core_attn', 'moe_act', 'layernorm', 'moe'}",
                    1,
                ),
                (
                    "AssertionError",
                    "Invalid choices for recompute_modules: {'attention'}. Allowed modules are: {'mla_up_proj', 'shared_experts', 'mhc', 'layernorm', 'core_attn', 'moe', 'gdp_in_proj', 'gdp_qkv', 'mlp', 'gdn_norm_out', 'moe_act'}",
                    1,
                ),
            ],
        ),
        (
            TC_MOE_LAYER_RECOMPUTE_WITH_FULL,
            [
                (
                    "ValueError",
                    "Do not set --moe-layer-recompute with full recompute granularity.   [warnings: --moe-layer-recompute is deprecated. Use --recompute-granularity selective --recompute-modules moe_layer instead.]",
                    2,
                )
            ],
        ),
    ],
)
def test_megatron_validation_messages(block, expected):
    # tc-measured-*: TransformerConfig validation, measured on core_v0.14.0 and main
    # (https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/core/transformer/transformer_config.py#L1884-L2030)
    errors = parse_log(block).errors
    assert [(e.type, e.message, e.count) for e in errors] == expected


def _real_checkpoint_tracebacks() -> tuple[str, str]:
    """Run the public torch.utils.checkpoint code into the errors of ckpt-local-kwargs-reentrant
    and ckpt-local-grad-reentrant, chained both ways; return Python's own tracebacks."""
    import torch
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    first: ValueError | None = None
    try:
        try:
            checkpoint(lambda t, scale: lin(t) * scale, x, use_reentrant=True, scale=2.0)
        except ValueError as exc:
            first = exc
            out = checkpoint(lin, x, use_reentrant=True)
            torch.autograd.grad(out.sum(), x)
    except RuntimeError as second:
        context = traceback.format_exc()
        try:
            raise second from first
        except RuntimeError:
            cause = traceback.format_exc()
    return context, cause


def test_real_chained_tracebacks():
    context, cause = _real_checkpoint_tracebacks()
    for text, chained in ((context, "context"), (cause, "cause")):
        errors = parse_log(text).errors
        assert [e.type for e in errors] == ["ValueError", "RuntimeError"]
        assert errors[0].message == "Unexpected keyword arguments: scale"
        assert errors[1].message.startswith("When use_reentrant=True, torch.utils.checkpoint")
        assert [e.chained for e in errors] == ["", chained]
        # frames, innermost last
        assert re.search(r"torch/utils/checkpoint\.py:\d+ in checkpoint$", errors[0].frames[-1])
        assert re.search(r"torch/utils/checkpoint\.py:\d+ in backward$", errors[1].frames[-1])
        assert "test_evidence.py" in errors[1].frames[0] or "<" in errors[1].frames[0]


def test_tracebacks_of_two_ranks_interleaved():
    # noise: two ranks print the same real traceback, torchrun prefixes, lines interleaved
    context, _ = _real_checkpoint_tracebacks()
    a = ["[rank0]: " + line for line in context.splitlines()]
    b = ["[rank1]: " + line for line in context.splitlines()]
    mixed = [line for pair in zip(a, b, strict=True) for line in pair]
    errors = parse_log("\n".join(mixed)).errors
    assert [(e.type, e.count, e.rank) for e in errors] == [
        ("ValueError", 2, 0),
        ("RuntimeError", 2, 0),
    ]
    single = parse_log(context).errors
    assert [e.frames for e in errors] == [e.frames for e in single]


def test_real_python_warnings():
    # real warnings, formatted by Python's warnings module: torch's checkpoint without inputs
    # that need grad (ckpt-local-no-input-grad) and the stdlib re module's FutureWarning
    import torch
    from torch.utils.checkpoint import checkpoint

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checkpoint(torch.nn.Linear(4, 4), torch.randn(2, 4), use_reentrant=True)
        re.compile("[[a]]")
    text = "".join(
        warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in caught
    )
    errors = parse_log(text).errors
    assert [(e.kind, e.type) for e in errors] == [
        ("warning", "UserWarning"),
        ("warning", "FutureWarning"),
    ]
    assert errors[0].message == "None of the inputs have requires_grad=True. Gradients will be None"
    assert re.search(r"torch/utils/checkpoint\.py:\d+$", errors[0].frames[0])
    assert errors[1].message == "Possible nested set at position 1"


def test_warning_naming_an_exception_stays_a_warning():
    # noise: NeMo's logging prefix around the real tc-measured-moe-layer warning text, and a
    # Python warning whose message quotes an exception line (ckpt-local-kwargs-reentrant)
    text = (
        "[NeMo W 2025-01-01 12:00:00 arguments:1] --moe-layer-recompute is deprecated. "
        "Use --recompute-granularity selective --recompute-modules moe_layer instead.\n"
        "train.py:3: UserWarning: " + CKPT_KWARGS_REENTRANT
    )
    errors = parse_log(text).errors
    assert [(e.kind, e.type) for e in errors] == [
        ("warning", "WARNING"),
        ("warning", "UserWarning"),
    ]
    assert errors[1].message == CKPT_KWARGS_REENTRANT.strip()
    assert errors[1].frames == ["train.py:3"]


def test_exception_message_does_not_swallow_other_records():
    # a standalone exception line (ckpt-local-kwargs-reentrant), then lines other parsers need
    text = (
        CKPT_KWARGS_REENTRANT
        + ARGS_NCCL_743
        + NEMO1_LAUNCHER_55
        + "PYTORCH_ALLOC_CONF=expandable_segments:True\n"
    )
    evidence = parse_log(text)
    (error,) = evidence.errors
    assert error.details == ""
    assert evidence.config["lr"] == 0.0001
    assert evidence.iterations[0].iteration == 795
    assert evidence.env == {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}


def test_repeated_warnings_are_counted():
    # ckpt-local-use-reentrant-missing printed by 8 ranks
    text = "\n".join(f"[rank{r}]: " + CKPT_USE_REENTRANT_MISSING.strip() for r in range(8))
    (warning,) = parse_log(text).errors
    assert warning.count == 8 and warning.rank == 0


# =============================================================================================
# Configs: YAML/JSON, command lines, Hydra overrides, Python assignments, argument dumps
# =============================================================================================


def test_config_yaml_nested_under_model_bridge_style():
    # key/values of the Megatron Bridge docs (seeds/000: recompute_granularity="full",
    # recompute_method="uniform", recompute_num_layers=4; MoE example num_moe_experts=8,
    # expert_model_parallel_size=2) written as a Megatron-Bridge YAML override file
    text = textwrap.dedent(
        """\
        model:
          recompute_granularity: full
          recompute_method: uniform
          recompute_num_layers: 4
          num_moe_experts: 8
          expert_model_parallel_size: 2
        train:
          micro_batch_size: 1
        trainer:
          devices: 8
        """
    )
    config = parse_config(text, "override.yaml")
    assert config == {
        "recompute_granularity": "full",
        "recompute_method": "uniform",
        "recompute_num_layers": 4,
        "num_moe_experts": 8,
        "expert_model_parallel_size": 2,
        "micro_batch_size": 1,
        "trainer.devices": 8,
    }


def test_config_yaml_nemo_activations_checkpoint_keys():
    # seeds/002 (NeMo docs): activations_checkpoint_granularity=full,
    # activations_checkpoint_method=block, activations_checkpoint_num_layers
    text = textwrap.dedent(
        """\
        trainer:
          precision: bf16-mixed
        model:
          activations_checkpoint_granularity: full
          activations_checkpoint_method: block
          activations_checkpoint_num_layers: 1
          sequence_parallel: true
          tensor_model_parallel_size: 8
        """
    )
    config = parse_config(text)
    assert config["recompute_granularity"] == "full"
    assert config["recompute_method"] == "block"
    assert config["recompute_num_layers"] == 1
    assert config["sequence_parallel"] is True and config["tensor_model_parallel_size"] == 8
    assert config["bf16"] is True and config["trainer.precision"] == "bf16-mixed"


def test_config_json_flat():
    # seeds/001: recompute_granularity = "selective", recompute_modules = ["core_attn", "layernorm"]
    text = json.dumps(
        {"recompute_granularity": "selective", "recompute_modules": ["core_attn", "layernorm"]}
    )
    assert parse_config(text, "cfg.json") == {
        "recompute_granularity": "selective",
        "recompute_modules": ["core_attn", "layernorm"],
    }


def test_config_bridge_command_line_from_seed():
    # seeds/001: the skill's run_performance_workload.py command, backslash-continued
    assert parse_config(SEED_BRIDGE_COMMAND) == {
        "recompute_granularity": "selective",
        "recompute_modules": ["core_attn", "layernorm"],
    }


def test_config_megatron_flags_from_docs():
    # megatron-recompute.md: Megatron's fine-grained offloading doc example and the
    # moe-layer-recompute deprecation message (real-formats.md tc-measured-moe-layer-...)
    config = parse_config(
        "--recompute-modules layernorm moe_act --offload-modules core_attn attn_proj expert_fc1"
    )
    assert config == {
        "recompute_modules": ["layernorm", "moe_act"],
        "offload_modules": ["core_attn", "attn_proj", "expert_fc1"],
    }
    config = parse_config("--recompute-granularity selective --recompute-modules moe_layer")
    assert config == {"recompute_granularity": "selective", "recompute_modules": ["moe_layer"]}


def test_config_megatron_command_line_multiline():
    # Megatron-LM flags (names as in Megatron-LM's arguments.py) in a backslash-continued
    # torchrun command, with shell variables
    text = textwrap.dedent(
        """\
        export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        TP=8
        torchrun --nproc_per_node 8 pretrain_gpt.py \\
            --num-layers 80 --hidden-size 8192 --num-attention-heads 64 \\
            --seq-length 8192 --micro-batch-size 1 --bf16 \\
            --tensor-model-parallel-size ${TP} --sequence-parallel \\
            --use-distributed-optimizer \\
            --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 \\
            --num-experts 64 --moe-router-topk 8 --moe-grouped-gemm \\
            --multi-latent-attention --fp8-format hybrid \\
            --cpu-offloading-num-layers 2 --lr 6.0e-5 --lr-warmup-fraction .001 \\
            --no-gradient-accumulation-fusion
        """
    )
    config = parse_config(text, "train.sh")
    assert config["num_layers"] == 80 and config["hidden_size"] == 8192
    assert config["seq_length"] == 8192 and config["micro_batch_size"] == 1
    assert config["bf16"] is True and config["sequence_parallel"] is True
    assert config["tensor_model_parallel_size"] == 8  # ${TP} resolved
    assert config["use_distributed_optimizer"] is True
    assert (config["recompute_granularity"], config["recompute_method"]) == ("full", "uniform")
    assert config["recompute_num_layers"] == 1
    assert config["num_moe_experts"] == 64 and config["moe_router_topk"] == 8
    assert config["moe_grouped_gemm"] is True and config["multi_latent_attention"] is True
    assert config["fp8"] == "hybrid"
    assert config["cpu_offloading_num_layers"] == 2 and config["cpu_offloading"] is True
    assert config["lr"] == 6.0e-5 and config["lr_warmup_fraction"] == 0.001
    assert config["nproc_per_node"] == 8
    assert config["no_gradient_accumulation_fusion"] is True


def test_config_recompute_activations_means_selective():
    # megatron-recompute.md rule 26: --recompute-activations => recompute_granularity selective
    config = parse_config(
        "python pretrain_gpt.py --recompute-activations --tensor-model-parallel-size 8"
    )
    assert config["recompute_granularity"] == "selective"
    assert config["tensor_model_parallel_size"] == 8


def test_config_hydra_overrides():
    config = parse_config(
        "model.recompute_modules=[mlp,core_attn] model.recompute_granularity=selective trainer.devices=8"
    )
    assert config == {
        "recompute_modules": ["mlp", "core_attn"],
        "recompute_granularity": "selective",
        "trainer.devices": 8,
    }
    # seeds/002 NeMo keys and seeds/001 settings, one override per line
    config = parse_config(
        "model.activations_checkpoint_granularity=full\n"
        "model.activations_checkpoint_method=block\n"
        "model.activations_checkpoint_num_layers=2\n"
        "distribute_saved_activations=True\n"
        "sequence_parallel=True\n"
        "+model.cpu_offloading=True\n"
        "model.recompute_modules=null\n"
    )
    assert config == {
        "recompute_granularity": "full",
        "recompute_method": "block",
        "recompute_num_layers": 2,
        "distribute_saved_activations": True,
        "sequence_parallel": True,
        "cpu_offloading": True,
        "recompute_modules": None,
    }


def test_config_python_assignments_from_seeds():
    # seeds/001 cfg.model.* lines and seeds/000 GPTModelProvider(...) keyword arguments
    assert parse_config(SEED_CFG_ASSIGNMENTS) == {
        "recompute_modules": ["core_attn", "layernorm"],
        "recompute_method": "uniform",
    }
    assert parse_config(SEED_CFG_DEFAULTS) == {
        "recompute_granularity": None,
        "recompute_modules": None,
        "fine_grained_activation_offloading": False,
    }
    assert parse_config(SEED_PROVIDER_FULL) == {
        "recompute_granularity": "full",
        "recompute_method": "uniform",
        "recompute_num_layers": 4,
    }
    assert parse_config(SEED_PROVIDER_MODULES) == {
        "recompute_granularity": "selective",
        "recompute_modules": [
            "core_attn",
            "mlp",
            "layernorm",
            "moe",
            "moe_act",
            "shared_experts",
            "mla_up_proj",
        ],
    }


def test_config_argument_dump():
    # ex-args-local-v014-full and ex-args-mlm-495 as config files
    config, notes = parse_config_with_notes(ARGS_LOCAL_V014_FULL, "args.txt")
    assert config["recompute_granularity"] == "full" and config["recompute_num_layers"] == 2
    assert config["recompute_modules"] is None and config["world_size"] == 8
    assert "argument dump" in notes[0]
    assert parse_config(ARGS_MLM_495)["hidden_size"] == 5120


@pytest.mark.parametrize(
    "garbage",
    ["", "   \n", "\x00\x01\x02", "{not json", ": : :", "- a\n- b", OOM_GEN4, "[[[[[[[[[["],
)
def test_config_garbage_gives_a_dict(garbage):
    config, notes = parse_config_with_notes(garbage)
    assert isinstance(config, dict)
    assert notes
    if garbage.strip() in ("", "{not json", ": : :", "- a\n- b"):
        assert config == {}


# =============================================================================================
# Experiments
# =============================================================================================

SEED_ROWS = [
    # name, modules, recompute, tflops, vs_golden, peak GB, oom, oom_rank, result
    ("Baseline", ["core_attn"], "selective", 704.0, -0.008, 58.8, True, 0, "OOM"),
    ("Exp 1", ["mlp"], "selective:mlp", 593.6, -0.164, 55.6, False, None, "Perf regression"),
    (
        "Exp 2",
        ["mlp", "core_attn"],
        "selective:mlp,core_attn",
        586.8,
        -0.173,
        55.6,
        False,
        None,
        "Perf regression",
    ),
    (
        "Exp 3",
        ["core_attn", "layernorm"],
        "selective:core_attn,layernorm",
        702.0,
        -0.011,
        59.6,
        True,
        0,
        "OOM",
    ),
]


def check_seed_rows(rows):
    assert len(rows) == 4
    for row, (name, mods, spec, tflops, vs, peak, oom, oom_rank, result) in zip(
        rows, SEED_ROWS, strict=True
    ):
        assert row["name"] == name
        assert row["recompute_modules"] == mods
        assert row["recompute"] == spec
        assert row["tflops_per_gpu"] == tflops
        assert row["vs_golden"] == vs
        assert row["peak_memory_bytes"] == round(peak * 1e9)
        assert row["oom"] is oom and row["oom_rank"] == oom_rank
        assert row["result"] == result


def test_experiments_markdown_table_from_seed():
    # seeds/001 (NVIDIA skill perf-activation-recompute): the Llama3-70B experiment table
    check_seed_rows(parse_experiments(SEED_EXPERIMENT_TABLE))


def test_experiments_only_result_tables_count():
    # the skill page's granularity, module and symptom tables give no rows
    assert parse_experiments(SEED_OTHER_TABLES) == []
    check_seed_rows(parse_experiments(SEED_OTHER_TABLES + SEED_EXPERIMENT_TABLE, "skill.md"))


def test_experiments_csv():
    # the seed table's cells, written out with the csv module
    import csv
    import io

    lines = [line for line in SEED_EXPERIMENT_TABLE.splitlines() if line.startswith("|")]
    header = [
        "Experiment",
        "recompute_modules",
        "TFLOP/s/GPU",
        "vs Golden",
        "Peak Mem (GB)",
        "Result",
    ]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    for line in lines[1:]:
        writer.writerow([cell.strip() for cell in line.strip("|").split("|")])
    check_seed_rows(parse_experiments(out.getvalue(), "results.csv"))
    # and as TSV
    tsv = io.StringIO()
    csv.writer(tsv, delimiter="\t").writerows(csv.reader(io.StringIO(out.getvalue())))
    check_seed_rows(parse_experiments(tsv.getvalue()))


def test_experiments_jsonl_keeps_every_key():
    # recompute-kit's ablation rows: one JSON object per line
    rows = [
        {
            "recompute": "selective",
            "tflops_per_gpu": 704.0,
            "peak_memory_bytes": 58_800_000_000,
            "status": "oom",
            "oom_rank": 0,
            "seconds": 12.5,
        },
        {
            "recompute": "selective:mlp",
            "tflops_per_gpu": 593.6,
            "peak_memory_bytes": 55_600_000_000,
            "status": "ok",
            "vs_golden": -0.164,
            "seed": 1234,
        },
        {"recompute": "full:uniform:1", "status": "error", "error": "ValueError: ..."},
    ]
    text = "\n".join(json.dumps(r) for r in rows) + "\nnot json\n"
    parsed = parse_experiments(text, "ablation.jsonl")
    assert [r["name"] for r in parsed] == ["selective", "selective:mlp", "full:uniform:1"]
    assert [r["recompute_modules"] for r in parsed] == [["core_attn"], ["mlp"], None]
    assert [r["oom"] for r in parsed] == [True, False, False]
    assert [r["result"] for r in parsed] == ["OOM", "OK", "error"]
    assert parsed[0]["oom_rank"] == 0 and parsed[0]["seconds"] == 12.5
    assert parsed[1]["seed"] == 1234 and parsed[1]["vs_golden"] == -0.164
    assert parsed[1]["peak_memory_bytes"] == 55_600_000_000
    assert parsed[2]["error"] == "ValueError: ..."
    # a JSON list of the same rows reads the same
    assert parse_experiments(json.dumps(rows)) == parsed


def test_experiments_memory_column_names():
    # figures of NVIDIA/Megatron-LM#1225 (megatron-recompute.md, issue table row 3):
    # --recompute-activations moved max allocated only from 25.52 to 24.94 GB
    text = (
        "| run | recompute | max allocated (GB) |\n|---|---|---|\n"
        "| baseline | none | 25.52 |\n| --recompute-activations | selective:core_attn | 24.94 |\n"
    )
    rows = parse_experiments(text)
    assert [(r["recompute"], r["peak_memory_bytes"]) for r in rows] == [
        ("none", 25_520_000_000),
        ("selective", 24_940_000_000),
    ]
    assert rows[1]["recompute_modules"] == ["core_attn"]


@pytest.mark.parametrize("garbage", ["", "|", "| a |\n|---|", "a,b\n1,2", "{]", "\x00" * 10])
def test_experiments_garbage(garbage):
    assert parse_experiments(garbage) == []


# =============================================================================================
# memory_stats and snapshots
# =============================================================================================


def test_memory_stats_real_json_and_repr():
    # json.dumps / print of torch.cuda.memory_stats() on an H100 (make_gpu_samples.py)
    for name in ("memory_stats.json", "memory_stats_repr.txt"):
        stats = parse_memory_stats((DATA / name).read_text())
        assert stats is not None, name
        assert stats["reserved_bytes.all.current"] == 83886080
        assert stats["inactive_split_bytes.all.current"] == 7337984
        assert stats["num_ooms"] == 3 and stats["num_alloc_retries"] == 3
        assert stats["fragmentation"] == 7337984 / 83886080
        assert stats["reserved_unallocated_bytes"] == 83886080 - 76548096


def test_memory_stats_nested_and_garbage():
    stats = json.loads((DATA / "memory_stats.json").read_text())
    nested = {
        "allocated_bytes": {"all": {"current": stats["allocated_bytes.all.current"]}},
        "reserved_bytes": {"all": {"current": stats["reserved_bytes.all.current"]}},
    }
    parsed = parse_memory_stats(json.dumps({"memory_stats": nested}))
    assert parsed["allocated_bytes.all.current"] == 76548096
    for garbage in ("", "{}", "[1, 2]", '{"a": 1}', "not a dict", OOM_GEN1):
        assert parse_memory_stats(garbage) is None


def test_snapshot_real_pickle():
    # torch.cuda.memory._dump_snapshot() on an H100 (make_gpu_samples.py)
    summary = load_snapshot(DATA / "cuda_snapshot.pickle")
    assert summary["segments"] == 4
    assert summary["total_reserved_bytes"] == 83886080  # = memory_stats reserved_bytes
    assert summary["total_allocated_bytes"] == 76548096  # = memory_stats allocated_bytes
    assert summary["inactive_split_bytes"] == 7337984  # = memory_stats inactive_split_bytes
    assert summary["largest_free_block_bytes"] == 5 << 20
    assert summary["fragmentation"] == 7337984 / 83886080
    assert summary["oom_trace_entries"] == 3


def _snapshot_dict() -> dict:
    """A dict shaped like torch.cuda.memory._snapshot() (fields as in section 6.2)."""
    frames = [{"filename": "train.py", "line": 12, "name": "forward"}]
    return {
        "segments": [
            {
                "address": 1 << 32,
                "total_size": 20 * MiB,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "allocated_size": 12 * MiB,
                "active_size": 12 * MiB,
                "blocks": [
                    {
                        "size": 8 * MiB,
                        "requested_size": 8 * MiB - 100,
                        "address": 1 << 32,
                        "state": "active_allocated",
                        "frames": frames,
                    },
                    {
                        "size": 6 * MiB,
                        "requested_size": 0,
                        "address": (1 << 32) + 8 * MiB,
                        "state": "inactive",
                        "frames": [],
                    },
                    {
                        "size": 4 * MiB,
                        "requested_size": 4 * MiB,
                        "address": (1 << 32) + 14 * MiB,
                        "state": "active_awaiting_free",
                        "frames": frames,
                    },
                    {
                        "size": 2 * MiB,
                        "requested_size": 0,
                        "address": (1 << 32) + 18 * MiB,
                        "state": "inactive",
                        "frames": [],
                    },
                ],
            },
            {
                "address": 1 << 34,
                "total_size": 2 * MiB,
                "stream": 0,
                "segment_type": "small",
                "segment_pool_id": (0, 0),
                "allocated_size": 0,
                "active_size": 0,
                "blocks": [
                    {
                        "size": 2 * MiB,
                        "requested_size": 0,
                        "address": 1 << 34,
                        "state": "inactive",
                        "frames": [],
                    }
                ],
            },
        ],
        "device_traces": [
            [
                {
                    "action": "alloc",
                    "addr": 1 << 32,
                    "size": 8 * MiB,
                    "stream": 0,
                    "frames": frames,
                },
                {
                    "action": "oom",
                    "addr": 0,
                    "size": 64 * GiB,
                    "stream": 0,
                    "frames": frames,
                    "device_free": 3 * MiB,
                },
            ]
        ],
    }


def test_snapshot_built_dict_pickle_and_json(tmp_path):
    data = _snapshot_dict()
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(data))
    summary = load_snapshot(path)
    assert summary["segments"] == 2
    assert summary["total_reserved_bytes"] == 22 * MiB
    assert summary["total_allocated_bytes"] == 12 * MiB  # active_allocated + awaiting free
    assert summary["largest_free_block_bytes"] == 6 * MiB
    assert summary["inactive_split_bytes"] == 8 * MiB  # free blocks beside active ones only
    assert summary["fragmentation"] == 8 / 22
    assert summary["oom_trace_entries"] == 1 and summary["trace_entries"] == 2
    # the same snapshot saved as JSON (tuples become lists)
    json_path = tmp_path / "snap.json"
    json_path.write_text(json.dumps(data))
    assert load_snapshot(json_path) == summary
    assert summarize_snapshot(data["segments"])["total_reserved_bytes"] == 22 * MiB


class _Evil:
    """Unpickling this would run a shell command that creates a file."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.target}",))


def test_snapshot_refuses_any_global_and_runs_nothing(tmp_path):
    target = tmp_path / "pwned"
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "x": _Evil(target)}))
    with pytest.raises(EvidenceError) as info:
        load_snapshot(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"refusing to load snapshot '{path}': it references os.system")
    assert "plain containers" in message
    assert not target.exists()
    # builtins.eval through a protocol-0 pickle (GLOBAL opcode)
    path.write_bytes(b"cbuiltins\neval\n(S'1+1'\ntR.")
    with pytest.raises(EvidenceError, match=r"references builtins\.eval"):
        load_snapshot(path)
    # a class instance (even a harmless one) is not a snapshot either
    path.write_bytes(pickle.dumps({"segments": [], "p": Path("x")}))
    with pytest.raises(EvidenceError, match="refusing to load snapshot"):
        load_snapshot(path)


def test_snapshot_corrupt_truncated_missing(tmp_path):
    blob = (DATA / "cuda_snapshot.pickle").read_bytes()
    path = tmp_path / "cut.pickle"
    for cut in (1, 10, len(blob) // 2, len(blob) - 1):
        path.write_bytes(blob[:cut])
        with pytest.raises(EvidenceError) as info:
            load_snapshot(path)
        assert "\n" not in str(info.value) and "snapshot" in str(info.value)
    path.write_bytes(b"\x00garbage\xff" * 10)
    with pytest.raises(EvidenceError):
        load_snapshot(path)
    path.write_bytes(pickle.dumps([1, 2, 3]))  # plain, but not a snapshot
    assert load_snapshot(path)["segments"] == 0
    path.write_bytes(pickle.dumps("just a string"))
    with pytest.raises(EvidenceError, match="not a memory snapshot"):
        load_snapshot(path)
    for broken in ("{broken json", "[" * 100_000):
        path.write_text(broken)
        with pytest.raises(EvidenceError, match="not valid JSON"):
            load_snapshot(path)
    with pytest.raises(
        EvidenceError, match=r"^cannot read snapshot '.*nope\.pickle': No such file"
    ):
        load_snapshot(tmp_path / "nope.pickle")


# =============================================================================================
# collect()
# =============================================================================================


def test_collect_everything(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(ARGS_LOCAL_V014_FULL + MLM_756_MEMORY + OOM_GEN6)
    config = tmp_path / "run.sh"
    config.write_text("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True " + SEED_BRIDGE_COMMAND)
    experiments = tmp_path / "results.md"
    experiments.write_text(SEED_EXPERIMENT_TABLE)
    evidence = collect(
        logs=[str(log), "-"],
        config=str(config),
        experiments=str(experiments),
        memory_stats=str(DATA / "memory_stats.json"),
        snapshot=str(DATA / "cuda_snapshot.pickle"),
        stdin_text=MLM_756_ITERS,
    )
    assert isinstance(evidence, Evidence)
    assert len(evidence.oom) == 1 and evidence.oom[0].rank == 97
    assert [i.iteration for i in evidence.iterations] == [2, 3, 71, 72, 73]
    # the log's argument dump, then the config file (later keys win)
    assert evidence.config["recompute_granularity"] == "selective"
    assert evidence.config["recompute_modules"] == ["core_attn", "layernorm"]
    assert evidence.config["world_size"] == 8
    assert evidence.env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert len(evidence.experiments) == 4
    assert evidence.memory_stats["num_ooms"] == 3
    assert evidence.snapshot["segments"] == 4
    assert evidence.sources == [
        f"log:{log}",
        "log:<stdin>",
        f"config:{config}",
        f"experiments:{experiments}",
        f"memory_stats:{DATA / 'memory_stats.json'}",
        f"snapshot:{DATA / 'cuda_snapshot.pickle'}",
    ]
    json.dumps(evidence.to_json())  # JSON-ready


def test_collect_errors_are_one_line(tmp_path):
    with pytest.raises(EvidenceError) as info:
        collect(logs=["x"])
    assert str(info.value) == "cannot read log 'x': No such file or directory"
    with pytest.raises(EvidenceError, match=r"^cannot read config '.*': Is a directory$"):
        collect(config=str(tmp_path))
    with pytest.raises(EvidenceError, match=r"cannot read experiments 'missing\.csv'"):
        collect(experiments="missing.csv")
    with pytest.raises(EvidenceError, match="from stdin"):
        collect(config="-")
    empty = tmp_path / "empty.json"
    empty.write_text("")
    evidence = collect(memory_stats=str(empty), config=str(empty))
    assert evidence.memory_stats is None and evidence.config == {}
    assert len(evidence.notes) == 2


def test_evidence_merge_and_json():
    a = parse_log(OOM_GEN1)
    b = parse_log(MLM_756_ITERS)
    merged = a.merge(b)
    assert len(merged.oom) == 1 and len(merged.iterations) == 3
    assert isinstance(merged.errors[0], ErrorEvent) and isinstance(merged.iterations[0], Iteration)
    assert json.loads(json.dumps(merged.to_json()))["oom"][0]["generation"] == "gen1_cached"


# =============================================================================================
# Never raise: property-based
# =============================================================================================

REAL_LINES = [
    line
    for block in (
        OOM_GEN4,
        OOM_GEN6,
        MLM_756_ITERS,
        MLM_756_MEMORY,
        MB_PR841,
        NEMO_14850,
        ARGS_LOCAL_V014_FULL,
        CKPT_METADATA,
        TC_SELECTIVE_BAD_MODULE,
        GPU_OOMS["plain"]["traceback"],
        SEED_EXPERIMENT_TABLE,
        SEED_PROVIDER_MODULES,
        SEED_BRIDGE_COMMAND,
    )
    for line in block.splitlines()
]
NOISE = [
    "",
    "[rank3]: ",
    " 0: ",
    "\x1b[31m",
    "\x1b[0m",
    "Traceback (most recent call last):",
    '  File "x.py", line 1, in f',
    "\r",
    "\t",
    "---",
    "|",
    "{",
    "[",
    "=",
    "\\",
]
_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_random_log = st.lists(
    st.one_of(
        st.sampled_from(REAL_LINES),
        st.sampled_from(REAL_LINES).map(lambda s: s[: len(s) // 2]),
        st.sampled_from(NOISE),
        st.text(max_size=80),
    ),
    max_size=40,
).map("\n".join)
_random_bytes = st.binary(max_size=2000).map(lambda b: b.decode("utf-8", errors="replace"))


def _all_parsers(text: str) -> None:
    assert isinstance(parse_log(text), Evidence)
    assert isinstance(parse_oom(text), list)
    assert isinstance(parse_config(text), dict)
    assert isinstance(parse_experiments(text), list)
    stats = parse_memory_stats(text)
    assert stats is None or isinstance(stats, dict)
    assert isinstance(clean_line(text), str)


@_SETTINGS
@given(st.text(max_size=3000))
def test_random_text_never_raises(text):
    _all_parsers(text)


@_SETTINGS
@given(_random_bytes)
def test_random_bytes_never_raise(text):
    _all_parsers(text)


@_SETTINGS
@given(_random_log)
def test_shuffled_real_lines_never_raise(text):
    _all_parsers(text)
    json.dumps(parse_log(text).to_json())


def test_empty_input():
    _all_parsers("")
    assert parse_log("") == Evidence()
    assert parse_oom("") == [] and parse_config("") == {} and parse_experiments("") == []


@pytest.mark.parametrize(
    "block",
    [
        OOM_GEN1,
        OOM_GEN4,
        OOM_GEN6,
        MB_PR841,
        ARGS_LOCAL_V014_FULL,
        CKPT_METADATA,
        SEED_PROVIDER_MODULES,
    ],
)
def test_truncations_at_every_position_never_raise(block):
    step = max(1, len(block) // 400)
    for cut in range(0, len(block) + 1, step):
        _all_parsers(block[:cut])


def test_long_hostile_lines_stay_linear():
    """Long lines built to make careless regexes backtrack (runs of spaces before the end of
    a pattern, long words, repeated labels): all parsers stay fast."""
    n = 20_000
    hostile = [
        "  a ... v" + " " * n + "x",
        "[Rank 0]" + " " * n + "x memory (MB) | allocated: 1",
        "using world size " + "a" * n,
        "cfg.a = 1" + " " * n + "x",
        '  File "x' + " " * n + 'y", line 1, in f' + " " * n + "z",
        "x " + "a." * n + " Error",
        "a:" * n + "Error",
        "a:1: " * (n // 4) + "UserWarning: x",
        "CUDA out of memory. Tried to allocate " + "1 " * n,
        "iteration 1/2 |" + " elapsed time per iteration (ms):" * 600 + "x" * n,
        "iteration 1/ 2 |" + "a: b |" * (n // 4),
        "Tried to allocate " + "9" * n + " MiB",
        "a.b=" + "[" * n,
    ]
    start = time.process_time()  # CPU: immune to load
    for text in hostile:
        _all_parsers(text)
    assert time.process_time() - start < 5.0


# =============================================================================================
# A 100 MB log, streamed
# =============================================================================================


def _write_big_log(path: Path, size: int) -> None:
    """Real lines repeated with noise (rank prefixes, ANSI, timestamps, NeMo lines, argument
    dumps, warnings), and one hard-wrapped OOM of rank 97 in the middle."""
    iters = MLM_756_ITERS.splitlines()
    unit: list[str] = []
    for i in range(20):
        for line in iters:
            unit.append(f"[rank{i % 8}]: \x1b[32m{line}\x1b[0m" if i % 4 == 0 else line)
    unit += MLM_756_MEMORY.splitlines() + NEMO_14850.splitlines() + ARGS_NCCL_743.splitlines()
    unit += CKPT_USE_REENTRANT_MISSING.splitlines()
    unit += [f"2025-01-01 12:00:0{i}.123 INFO step {i} done" for i in range(10)]
    chunk = ("\n".join(unit) + "\n").encode()
    oom = "\n".join("[rank97]: " + part for part in textwrap.wrap(OOM_MESSAGES["gen6"], 80))
    written = 0
    with path.open("wb") as fh:
        while written < size:
            fh.write(chunk)
            written += len(chunk)
            if written - len(chunk) < size // 2 <= written:
                fh.write(oom.encode() + b"\n")


def test_100mb_log_streams_fast(tmp_path):
    path = tmp_path / "big.log"
    _write_big_log(path, 100 * 2**20)
    assert path.stat().st_size >= 100 * 2**20
    # CPU time of this process: the parse is single-threaded, and a loaded machine stretches
    # wall time without changing the work done.
    start = time.process_time()
    evidence = parse_log_file(path)
    elapsed = time.process_time() - start
    print(f"parse_log_file: {path.stat().st_size / 2**20:.0f} MiB in {elapsed:.2f} s of CPU")
    assert elapsed < 10.0
    (oom,) = evidence.oom
    assert oom.rank == 97 and oom.requested_bytes == nbytes(48.00, MiB)
    assert oom.total_bytes == nbytes(139.81, GiB) and not oom.truncated
    assert len(evidence.iterations) > 200_000
    assert evidence.errors[0].count > 1000  # the repeated warning, counted once
    assert evidence.config["lr"] == 0.0001


def test_streamed_lines_across_tiny_chunks():
    import io

    from recompute_kit.doctor.evidence.text import _iter_file_lines

    # real lines (ex-nemo-14850 has trailing spaces, gen4 is hard-wrapped) with CRLF, CR,
    # multi-byte characters and a line longer than the limit, read 7 bytes at a time
    text = NEMO_14850.replace("\n", "\r\n") + "µ—✓\r" + OOM_GEN4 + "y" * 70_000 + "\nend"
    expected = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    expected = [line[: 1 << 16] for line in expected]
    for chunk_size in (2, 3, 7, 64):
        got = list(_iter_file_lines(io.BytesIO(text.encode()), chunk_size=chunk_size))
        assert got == expected, chunk_size


def test_log_file_gzip_crlf_and_long_lines(tmp_path):
    import gzip

    path = tmp_path / "train.log.gz"
    text = MLM_756_ITERS.replace("\n", "\r\n") + ("x" * 200_000) + "\n" + OOM_GEN5
    with gzip.open(path, "wt") as fh:
        fh.write(text)
    evidence = parse_log_file(path)
    assert [i.iteration for i in evidence.iterations] == [71, 72, 73]
    check_oom(evidence.oom[0], *OOM_CASES["gen5"][1:])
    assert evidence.sources == [f"log:{path}"]


# =============================================================================================
# Other devices' and old PyTorch's out-of-memory wordings (issue 13), verbatim from the threads
# =============================================================================================


def test_oom_xpu_and_npu_wordings():
    # https://github.com/intel/intel-extension-for-pytorch/issues/629 (IPEX, old layout, no
    # "free" field)
    (ipex,) = parse_oom(
        "RuntimeError: XPU out of memory. Tried to allocate 1.71 GiB (GPU 0; 15.56 GiB total "
        "capacity; 176.00 MiB already allocated; 176.00 MiB reserved in total by PyTorch)"
    )
    assert (ipex.backend, ipex.device, ipex.free_bytes) == ("xpu", 0, None)
    assert ipex.total_bytes == nbytes(15.56, GiB) and ipex.reserved_bytes == nbytes(176.0, MiB)
    # the same thread: IPEX's per-allocation cap, printed with "(GPU  0;" (two spaces)
    (cap,) = parse_oom(
        "RuntimeError: Current platform can NOT allocate memory block with size larger than "
        "4GB! Tried to allocate 6.85 GiB (GPU  0; 15.56 GiB total capacity; 0 bytes already "
        "allocated; 0 bytes reserved in total by PyTorch)"
    )
    assert (cap.backend, cap.device, cap.allocation_limit_bytes) == ("xpu", 0, 4 * GiB)
    # https://github.com/intel/torch-xpu-ops/issues/3011 (torch.xpu 2.12: the 2.1+ layout with
    # its own advice), rank-prefixed and hard-wrapped here the way torchrun prints it
    message = (
        "torch.OutOfMemoryError: XPU out of memory. Tried to allocate 4.66 GiB. GPU 0 has a "
        "total capacity of 5.65 GiB of which 5.65 GiB is free. Of the allocated memory 195.50 "
        "KiB is allocated by PyTorch, and 1.81 MiB is reserved by PyTorch but unallocated. "
        "Please use `empty_cache` to release all unoccupied cached memory."
    )
    (xpu,) = parse_oom(message)
    assert (xpu.generation, xpu.backend, xpu.truncated) == ("xpu_empty_cache", "xpu", False)
    assert xpu.reserved_unallocated_bytes == nbytes(1.81, MiB)
    wrapped = "\n".join("[rank1]: " + message[i : i + 70] for i in range(0, len(message), 70))
    (again,) = parse_log(wrapped + "\n[rank1]: next line").oom
    assert (again.rank, again.requested_bytes) == (1, xpu.requested_bytes)
    # https://github.com/vllm-project/vllm-ascend/issues/19 (torch_npu, "current active")
    (npu,) = parse_oom(
        "RuntimeError: NPU out of memory. Tried to allocate 22.00 MiB (NPU 0; 60.97 GiB total "
        "capacity; 10.24 GiB already allocated; 10.24 GiB current active; 19.52 MiB free; 10.65 "
        "GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting "
        "max_split_size_mb to avoid fragmentation."
    )
    assert (npu.backend, npu.generation) == ("npu", "gen3_max_split")
    assert npu.free_bytes == nbytes(19.52, MiB)
    # 60.97 - 0.02 free - 10.65 reserved: 50.3 GiB held outside this process's allocator
    assert 50.2 * GiB < npu.held_elsewhere_bytes < 50.4 * GiB


def test_oom_pytorch_0_3_and_0_4_thc_message():
    # https://github.com/jiesutd/NCRFpp/issues/121 and https://github.com/chenyuntc/
    # pytorch-best-practice/issues/3 (no spaces): THC's error, no sizes at all
    for line in (
        "RuntimeError: cuda runtime error (2) : out of memory at "
        "/pytorch/torch/lib/THC/generic/THCStorage.cu:58",
        "RuntimeError:cuda runtime error(2):out of memory",
    ):
        evidence = parse_log(line)
        (oom,) = evidence.oom
        assert (oom.generation, oom.truncated, oom.requested_bytes) == (
            "thc_runtime_error",
            False,
            None,
        )
        assert evidence.errors[0].type == "RuntimeError"


def test_oom_gen1_cached_is_reserved_but_unallocated():
    # https://github.com/BaberMuyu/2020CCF-NER/issues/6 (PyTorch <= 1.4): "cached" is what the
    # allocator holds unallocated, so only 0.86 GiB of the 7.79 GiB GPU is outside PyTorch.
    (oom,) = parse_oom(
        "RuntimeError: CUDA out of memory. Tried to allocate 294.00 MiB (GPU 0; 7.79 GiB total "
        "capacity; 6.27 GiB already allocated; 61.62 MiB free; 617.88 MiB cached)"
    )
    assert oom.reserved_unallocated_bytes == nbytes(617.88, MiB)
    assert oom.reserved_bytes == nbytes(6.27, GiB) + nbytes(617.88, MiB)
    assert 0.8 * GiB < oom.held_elsewhere_bytes < 0.9 * GiB


def test_pasted_settings_command_line_and_yaml():
    from recompute_kit.doctor.evidence.pasted import parse_pasted_settings

    # https://github.com/openai/improved-diffusion/issues/3: flags inside shell variables
    flat = parse_pasted_settings(
        'MODEL_FLAGS="--image_size 256 --num_channels 128 --num_res_blocks 2"\n'
        'TRAIN_FLAGS="--lr 1e-4 --batch_size 4"\n'
        "mpiexec -n 4 python scripts/image_train.py --data_dir /home/ubuntu/custom-data "
        "$MODEL_FLAGS $TRAIN_FLAGS\n"
    )
    assert flat["image_size"] == 256 and flat["batch_size"] == 4
    # https://github.com/hiyouga/LlamaFactory/issues/5977: a YAML block with comment lines
    flat = parse_pasted_settings(
        "### model\nmodel_name_or_path: /data/llm/Meta-Llama-3-8B-Instruct\n\n### method\n"
        "stage: sft\ndo_train: true\nfinetuning_type: full\n"
        "deepspeed: examples/deepspeed/ds_z3_config.json\n"
    )
    assert flat["finetuning_type"] == "full" and flat["do_train"] is True
    # exception lines are not YAML, frames are not flags
    assert parse_pasted_settings(OOM_GEN1) == {}
