"""Gradient and optimizer-state dtypes, Megatron-Bridge's mixed_precision precedence and the MoE
dispatcher type, read from the real corpus files (sources in each file's .expect.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from recompute_kit.memory.model_states import megatron_state_bytes
from recompute_kit.sources import bridge
from recompute_kit.sources.resolve import resolve

CORPUS = Path(__file__).parent / "corpus"
# https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/a9497c6b1cad42f11d875f72317d404140b003fb/scripts/performance/dryrun_configs/deepseek/deepseek_v3_pretrain_h100_fp8_sc_v1.yaml
DSV3 = CORPUS / "bridge" / "deepseek_v3_pretrain_h100_fp8_sc_v1.yaml"
# https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/a9497c6b1cad42f11d875f72317d404140b003fb/scripts/performance/dryrun_configs/qwen/qwen3_235b_a22b_pretrain_b200_nvfp4_v1.yaml
QWEN235 = CORPUS / "bridge" / "blind_qwen3_235b_a22b_pretrain_b200_nvfp4_v1.yaml"
# https://github.com/NVIDIA/Megatron-LM/blob/988ffe34b775265066da6a6a58e09e8cc6d832f7/examples/deepseek2_lite/train_deepseek2_lite_h100_fp8.sh
DS2_LITE = CORPUS / "megatron_lm" / "train_deepseek2_lite_h100_fp8.sh"
# https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/tests/functional_tests/test_cases/moe/gpt3_mcore_te_tp2_pp1_te_8experts2parallel_dist_optimizer/model_config.yaml
MLM_MOE = CORPUS / "megatron_lm" / "moe_tp2_pp1_te_8experts2parallel_dist_optimizer.yaml"
# https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/examples/configs/grpo_math_1B_megatron.yaml
GRPO_MEGATRON = CORPUS / "nemo_rl" / "grpo_math_1B_megatron.yaml"


def _where(reading, key: str) -> str:
    return reading.origins[key].describe()


def test_bridge_mixed_precision_wins_over_model_and_ddp():
    # mixed_precision.fp8_recipe: blockwise (line 240) over model.fp8_recipe: delayed (line
    # 346): MixedPrecisionConfig.setup copies its fields onto the model / optimizer / DDP
    # configs (training/mixed_precision.py, update_config_with_precision_overrides)
    r = resolve([str(DSV3)]).reading
    assert r.get("fp8_recipe") == "blockwise"
    assert _where(r, "fp8_recipe").endswith(":240 mixed_precision.fp8_recipe")
    assert r.get("grad_reduce_in_fp32") is False
    assert _where(r, "grad_reduce_in_fp32").endswith(":242 mixed_precision.grad_reduce_in_fp32")
    # ddp.grad_reduce_in_fp32: false (line 126) loses to mixed_precision's true (line 242)
    q = resolve([str(QWEN235)]).reading
    assert q.get("grad_reduce_in_fp32") is True
    assert _where(q, "grad_reduce_in_fp32").endswith(":242 mixed_precision.grad_reduce_in_fp32")


def test_bridge_optimizer_dtypes_and_dispatcher():
    res = resolve([str(DSV3)])
    r = res.reading
    assert r.get("use_precision_aware_optimizer") is True
    flag = "optimizer.use_precision_aware_optimizer"
    assert _where(r, "use_precision_aware_optimizer").endswith(f":694 {flag}")
    # `exp_avg_dtype: {_call_: false, _target_: torch.bfloat16}` (lines 644-649)
    assert (r.get("exp_avg_dtype"), r.get("exp_avg_sq_dtype")) == ("bf16", "bf16")
    assert _where(r, "exp_avg_dtype").endswith(":644 optimizer.exp_avg_dtype")
    assert r.get("main_params_dtype") == "fp32"
    assert r.get("moe_token_dispatcher_type") == "flex"
    # 2 B bf16 gradients; blockwise fp8 with fp32 main params: the distributed optimizer's
    # fp32 copy + bf16 moments = 8 B (was 4 B and 12 B)
    assert megatron_state_bytes(res.config) == (2, 8)


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("bf16_mixed", (True, None)),
        ("fp16-mixed", (False, None)),
        ("bf16_with_fp8_subchannel_scaling_mixed", (True, "blockwise")),
        ("bf16_with_fp8_current_scaling_mixed", (True, "tensorwise")),
        ("bf16_with_mxfp8_mixed", (True, "mxfp8")),
    ],
)
def test_bridge_named_precision_recipes(name, want):
    # training/mixed_precision.py: bf16_mixed grad_reduce_in_fp32=True, fp16_mixed False;
    # each fp8 recipe function sets cfg.fp8_recipe
    r = bridge.read_yaml(f"mixed_precision: {name}\n", "x.yaml")
    assert (r.get("grad_reduce_in_fp32"), r.get("fp8_recipe")) == want


def test_megatron_lm_grad_reduce_and_dispatcher():
    r = resolve([str(DS2_LITE)]).reading
    assert r.get("grad_reduce_in_fp32") is False  # --grad-reduce-in-bf16 (line 167)
    assert _where(r, "grad_reduce_in_fp32").endswith(":167 --grad-reduce-in-bf16")
    assert r.get("moe_token_dispatcher_type") == "alltoall"
    # --bf16 without the flag: arguments.py turns accumulate_allreduce_grads_in_fp32 on
    d = resolve([str(MLM_MOE)]).reading
    assert d.get("grad_reduce_in_fp32") is True
    assert d.origins["grad_reduce_in_fp32"].kind == "default"
    assert d.get("moe_token_dispatcher_type") == "allgather"


def test_megatron_lm_optimizer_flags(tmp_path: Path):
    script = tmp_path / "run.sh"
    script.write_text(
        "torchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 "
        "--seq-length 32 --micro-batch-size 1 --bf16 --use-distributed-optimizer "
        "--use-precision-aware-optimizer --main-grads-dtype bf16 --exp-avg-dtype bf16 "
        "--exp-avg-sq-dtype fp16 --main-params-dtype fp16\n"
    )
    r = resolve([str(script)]).reading
    got = [
        r.get(k)
        for k in (
            "use_precision_aware_optimizer",
            "grad_reduce_in_fp32",
            "main_params_dtype",
            "exp_avg_dtype",
            "exp_avg_sq_dtype",
        )
    ]
    assert got == [True, False, "fp16", "bf16", "fp16"]


def test_nemo_rl_megatron_state_dtypes():
    res = resolve([str(GRPO_MEGATRON)])
    r = res.reading
    assert r.get("grad_reduce_in_fp32") is False
    key = "policy.megatron_cfg.distributed_data_parallel_config.grad_reduce_in_fp32"
    assert _where(r, "grad_reduce_in_fp32").endswith(f":185 {key}")
    assert r.get("use_precision_aware_optimizer") is True
    assert r.get("moe_token_dispatcher_type") == "alltoall"
    # bf16 without fp8: TE's FusedAdam keeps the fp32 master copy as int16 remainders
    assert megatron_state_bytes(res.config) == (2, 10)


def test_grad_reduce_fallback_is_not_called_a_transformer_config_default():
    # a skill trial: grad_reduce_in_fp32 = True was labelled "Megatron-Core's TransformerConfig
    # default"; it is a DistributedDataParallelConfig field whose default is False (True is
    # Megatron-LM's for a bf16 run)
    hf = CORPUS / "hf_trainer" / "blind_smollm3_sft.yaml"
    origin = resolve([str(hf)], model="meta-llama/Llama-3.1-8B").reading.origins[
        "grad_reduce_in_fp32"
    ]
    assert "TransformerConfig" not in origin.describe()
    assert "DistributedDataParallelConfig default is False" in origin.describe()
    # a torchtitan run reduces in fp32 by its own default, [training] mixed_precision_reduce
    toml = CORPUS / "torchtitan" / "llama3_8b.toml"
    origin = resolve([str(toml)]).reading.origins["grad_reduce_in_fp32"]
    assert "Megatron" not in origin.describe() and "mixed_precision_reduce" in origin.describe()
