"""A launch script's world size that rests on an environment variable's default is assumed.

tests/sources/corpus/megatron_lm/blind_mixtral_8x7b_distributed.sh
(https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/examples/mixtral/train_mixtral_8x7b_distributed.sh),
verbatim:

    GPUS_PER_NODE=8
    MASTER_ADDR=${MASTER_ADDR:-"localhost"}
    NNODES=${SLURM_NNODES:-"1"}
    ...
    DISTRIBUTED_ARGS=(
        --nproc_per_node $GPUS_PER_NODE
        --nnodes $NNODES

The script never sets SLURM_NNODES: the 1 node is what it falls back to, not what it says.
The environment of the user running recompute-kit is never read.
"""

from __future__ import annotations

from pathlib import Path

from recompute_kit.sources.resolve import resolve
from recompute_kit.sources.summary import summary_lines

CORPUS = Path(__file__).parent / "corpus" / "megatron_lm"
MIXTRAL = CORPUS / "blind_mixtral_8x7b_distributed.sh"


def test_world_size_from_an_environment_default_is_assumed_and_says_so(monkeypatch):
    monkeypatch.setenv("SLURM_NNODES", "4")  # never read
    r = resolve([str(MIXTRAL)], require_shape=False)
    origin = r.reading.origins["world_size"]
    # the script's 8 GPUs x ${SLURM_NNODES:-1} cannot hold EP 8 x PP 4: the world assumed is the
    # smallest that does (32, DP 8), said with the script's default beside it. (A skill trial
    # saw world_size 8 beside DP 8 x PP 4 and a warning that computed DP 2.)
    assert (r.reading.get("world_size"), r.reading.get("data_parallel_size")) == (32, 8)
    assert origin.kind == "assumed"
    assert "NNODES = 1: the default of ${SLURM_NNODES:-1}" in origin.note
    assert "gives 8, too few" in origin.note
    assert not [w for w in r.reading.warnings if "cannot run as written" in w]
    # the key the user sets here is --dp: the environment is never read, so "set SLURM_NNODES"
    # would change nothing (a skill trial did and got the same assumption back)
    assert origin.key.startswith("--dp") and "SLURM_NNODES sets it" in origin.key
    lines = summary_lines(r.reading, r.inputs)
    assert any(line.startswith("  assumed: world_size = 32") for line in lines)


def test_dp_derived_from_an_assumed_world_is_assumed():
    # EP 1 (recompute-kit's --ep) so that DP = 8 / (TP 1 x PP 4) = 2 is derived from the world
    r = resolve([str(MIXTRAL)], overrides={"expert_model_parallel_size": 1}, require_shape=False)
    origin = r.reading.origins["data_parallel_size"]
    assert r.reading.get("data_parallel_size") == 2
    assert origin.kind == "assumed" and "SLURM_NNODES" in origin.note


def test_dp_override_still_sets_the_world():
    r = resolve([str(MIXTRAL)], overrides={"data_parallel_size": 16}, require_shape=False)
    assert r.reading.get("world_size") == 64  # 16 x TP 1 x PP 4
    assert r.reading.origins["world_size"].where.startswith("--dp 16")
    assert r.reading.origins["data_parallel_size"].kind == "argument"


def test_other_environment_defaults_do_not_make_a_literal_world_assumed():
    # blind_llama3_8b_h100_fp8.sh: NUM_NODES=1 written, MASTER_ADDR=${MASTER_ADDR:-localhost}
    # and NODE_RANK=${NODE_RANK:-0} in the same torchrun arguments
    r = resolve([str(CORPUS / "blind_llama3_8b_h100_fp8.sh")], require_shape=False)
    assert r.reading.get("world_size") == 8
    assert r.reading.origins["world_size"].kind == "file"


def test_the_read_table_leaves_out_defaults_of_features_the_run_does_not_use():
    # A skill trial: `read` on the Mixtral script listed MLA's kv_lora_rank 32 and
    # qk_pos_emb_head_dim 64 and fp8_recipe 'delayed' for a bf16 model without MLA: noise.
    from recompute_kit.sources.summary import table_rows

    r = resolve([str(MIXTRAL)], overrides={"data_parallel_size": 8}, require_shape=False)
    shown = {row[0] for row in table_rows(r.reading)}
    assert not shown & {"kv_lora_rank", "qk_pos_emb_head_dim", "fp8_recipe"}
    assert "kv_lora_rank" in r.reading.values  # `read --json` keeps every value
    assert {"num_moe_experts", "moe_router_topk", "recompute_granularity"} <= shown


def test_the_read_table_of_a_dense_model_leaves_out_every_moe_default():
    # A skill trial (this fp8 Llama 3 8B script): the table listed moe_aux_loss_coeff,
    # moe_token_dispatcher_type, expert_model_parallel_size and nine more MoE defaults.
    from recompute_kit.sources.summary import table_rows

    r = resolve([str(CORPUS / "blind_llama3_8b_h100_fp8.sh")], require_shape=False)
    shown = {row[0] for row in table_rows(r.reading)}
    assert "num_moe_experts" in shown  # None: says the model is dense
    assert not [k for k in shown if k.startswith(("moe_", "expert_"))]
