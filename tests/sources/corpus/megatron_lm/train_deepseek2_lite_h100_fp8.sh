#!/bin/bash

# Environment variables for performance tuning
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
#export LOG_LEVEL=${LOG_LEVEL:-INFO}
#export NCCL_IB_TIMEOUT=${NCCL_IB_TIMEOUT:-19}
#export NVTE_FWD_LAYERNORM_SM_MARGIN=${NVTE_FWD_LAYERNORM_SM_MARGIN:-16}
#export NVTE_BWD_LAYERNORM_SM_MARGIN=${NVTE_BWD_LAYERNORM_SM_MARGIN:-16}
#export NCCL_P2P_NET_CHUNKSIZE=${NCCL_P2P_NET_CHUNKSIZE:-2097152}
#export NCCL_AVOID_RECORD_STREAMS=${NCCL_AVOID_RECORD_STREAMS:-1}

CHECKPOINT_PATH=${1:-"checkpoints/deepseek2_lite_fp8"}
TENSORBOARD_LOGS_PATH=${2:-"tensorboard_logs/deepseek2_lite_fp8"}
# TOKENIZER_ARG=${3:-"MOCK"} # Path to tokenizer model, or "MOCK"
# TOKENIZER_ARG=${3:-"model/deepseek2_lite"} # Path to tokenizer model, or "MOCK"
TOKENIZER_ARG="deepseek-ai/DeepSeek-V2-Lite"

# DATA_ARG=${4:-"MOCK"}     # Data prefix, or "MOCK"
# DATA_ARG=${4:-"dataset/wikipedia_processed/wikipedia_processed_text_document"}     # Data prefix, or "MOCK"
DATA_ARG=${4:-"dataset/wikitext_processed/wikitext_processed_text_document"}     # Data prefix, or "MOCK"


# Create directories if they don't exist
rm -rf "$CHECKPOINT_PATH"
mkdir -p "$(dirname "$CHECKPOINT_PATH")"
mkdir -p "$(dirname "$TENSORBOARD_LOGS_PATH")"

# Distributed training setup
GPUS_PER_NODE=8
NUM_NODES=1
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
NODE_RANK=${NODE_RANK:-0}
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))

# Path to the pretrain_gpt.py script, assuming this script is run from the root of the Megatron-LM repository
PRETRAIN_SCRIPT_PATH="pretrain_gpt.py"

# Fixed model and training parameters for DeepSeek2-Lite
# Reference: examples/mcore/deepseek2_lite/pretrain_deepseek2_lite_16b_ptd_8p.sh (MindSpeed-LLM)
TP_SIZE=8
CP_SIZE=1     
PP_SIZE=1     
EP_SIZE=1     # Expert parallel size (for MoE)
MICRO_BATCH_SIZE=1  # default 1
GLOBAL_BATCH_SIZE=64 # default 128
NUM_LAYERS=16 
MOE_LAYERS=$(($NUM_LAYERS-1))
# Data type: "bf16" for transformer-impl local, "fp8" requires transformer_engine
# Note: FP8 is NOT supported with transformer-impl local. If using FP8, must set --transformer-impl transformer_engine
DTYPE="bf16"
# DTYPE=${5:-"fp8"}
SEQ_LENGTH=4096  # Reference script uses 4096
MAX_POSITION_EMBEDDINGS=4096  # For YaRN RoPE scaling

# Data cache path (useful for both mock and real data)
DATA_CACHE_PATH="${PWD}/benchmark_cache_deepseek2_lite_fp8"
mkdir -p "$DATA_CACHE_PATH"

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --node_rank $NODE_RANK
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)

# Model architecture parameters for DeepSeek2-Lite (1.3B parameters)
# Based on typical configurations for models of this size
# TOKENIZER_MODEL="deepseek-ai/DeepSeek-V2-Lite"

# Base GPT model arguments
# Reference: Based on MindSpeed-LLM script, adapted for Megatron-LM
GPT_ARGS=(
    --num-layers $NUM_LAYERS 
    --hidden-size 2048 
    --ffn-hidden-size 10944 
    --num-attention-heads 16 
    --kv-channels 16 
    --seq-length $SEQ_LENGTH 
    --max-position-embeddings $MAX_POSITION_EMBEDDINGS 
    --attention-dropout 0.0 
    --hidden-dropout 0.0 
    --disable-bias-linear 
    --untie-embeddings-and-output-weights 
    # --normalization LayerNorm 
    --normalization RMSNorm
    --norm-epsilon 1e-6 
    --swiglu 
    --no-masked-softmax-fusion 
    --attention-softmax-in-fp32 
    --use-mcore-models 
    --tokenizer-type HuggingFaceTokenizer 
    --make-vocab-size-divisible-by 3200 
    # --transformer-impl local  # Use local implementation (MCore). For FP8, must use transformer_engine
    --attention-backend local  # auto/flash/fused/unfused/local - auto lets system decide
    --init-method-std 0.02  # Reference script uses 0.02
)

# Multi-Latent Attention (MLA) arguments
# Reference: MindSpeed uses --multi-head-latent-attention, Megatron-LM uses --multi-latent-attention
# Note: Reference script uses --qk-rope-head-dim and --qk-nope-head-dim, but Megatron-LM uses --qk-pos-emb-head-dim
MLA_ARGS=(
    --multi-latent-attention 
    --kv-lora-rank 512 
    --v-head-dim 128 
    --qk-head-dim 128 
    --qk-layernorm 
    --qk-pos-emb-head-dim 64  # qk_head_dim = qk-head-dim + qk-pos-emb-head-dim = 128 + 64 = 192
)

# Mixture of Experts (MoE) arguments
# Reference: MindSpeed script uses --moe-intermediate-size, Megatron-LM uses --moe-ffn-hidden-size
# Reference: MindSpeed uses --n-shared-experts 2, Megatron-LM uses --moe-shared-expert-intermediate-size
# Reference: MindSpeed uses --first-k-dense-replace 1 (first layer is dense), we use --moe-layer-freq pattern
# Reference: MindSpeed uses --moe-layer-freq 1 (all layers MoE), but we keep first layer dense: ([0]+[1]*26)
MOE_ARGS=(
    --num-experts 64 
    --moe-layer-freq "([0]+[1]*$MOE_LAYERS)"  # First layer dense, rest are MoE (matches --first-k-dense-replace 1)
    --moe-ffn-hidden-size 1408  # Reference uses --moe-intermediate-size 1408
    --moe-grouped-gemm 
    --moe-router-score-function softmax 
    --moe-router-topk 6 
    --moe-router-topk-scaling-factor 1.0  # Reference uses --routed-scaling-factor 1.0
    --moe-router-pre-softmax 
    --moe-shared-expert-intermediate-size 2816  # Reference uses --n-shared-experts 2, this is 2 * 1408
    --moe-aux-loss-coeff 0.01  # Reference uses 0.01 (was 1e-3)
    --moe-token-dispatcher-type alltoall 
    --moe-token-drop-policy probs 
    --moe-router-load-balancing-type seq_aux_loss  # Reference uses --seq-aux, this is equivalent
    # Note: Reference script uses --moe-alltoall-overlap-comm, --moe-permutation-async-comm,
    #       --use-fused-moe-token-permute-and-unpermute - these are MindSpeed-specific and not in Megatron-LM
)

# Rotary Position Embedding (RoPE) arguments - YaRN RoPE scaling
# Reference: MindSpeed uses --rope-scaling-* parameters, Megatron-LM uses different names
# Note: Megatron-LM's MLA implementation uses YaRN RoPE by default when --multi-latent-attention is set
ROPE_ARGS=(
    --position-embedding-type rope 
    --no-rope-fusion 
    --rotary-percent 1.0 
    --rotary-base 10000 
    --rotary-scaling-factor 40  # Reference: --rope-scaling-factor 40
    --mscale 0.707  # Reference: --rope-scaling-mscale 0.707
    --mscale-all-dim 0.707  # Reference: --rope-scaling-mscale-all-dim 0.707
    # Note: YaRN beta-fast and beta-slow are set in MLATransformerConfig defaults (32 and 1)
    #       original_max_position_embeddings is also set in config (4096)
    #       These are not directly exposed as CLI args in Megatron-LM but can be set via config
)

TRAINING_ARGS=(
    --micro-batch-size $MICRO_BATCH_SIZE
    --global-batch-size $GLOBAL_BATCH_SIZE
    --train-samples 47340000
    --lr-decay-samples 47245280
    --lr-warmup-samples 94720
    --lr 0.00015
    --min-lr 0.00001
    --decoupled-lr 5.0e-4      # Specific to decoupled AdamW, ensure optimizer is compatible
    --decoupled-min-lr 4.5e-5  # Specific to decoupled AdamW
    --lr-decay-style cosine
    --clip-grad 1.0
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --bf16
    --grad-reduce-in-bf16
    --cross-entropy-loss-fusion
    --calculate-per-token-loss 
    --manual-gc 
    --empty-unused-memory-level 1 
    --exit-duration-in-mins 235000000 # default 235 
    --no-persist-layer-norm
)

# Conditional arguments based on DTYPE (FP8)
# WARNING: FP8 requires --transformer-impl transformer_engine, NOT local!
# If DTYPE="fp8", you must also change --transformer-impl to transformer_engine in GPT_ARGS above
DTYPE_ARGS=()
if [[ "$DTYPE" == "fp8" ]]; then
    # Verify transformer-impl is set to transformer_engine
    if grep -q "transformer-impl local" <<< "${GPT_ARGS[@]}"; then
        echo "ERROR: FP8 requires --transformer-impl transformer_engine, but local is set!"
        echo "Please change --transformer-impl local to --transformer-impl transformer_engine in GPT_ARGS"
        exit 1
    fi
    DTYPE_ARGS+=(
        "--fp8-format hybrid"
        "--fp8-amax-history-len 1024"
        "--fp8-amax-compute-algo max"
        "--fp8-param-gather"
    )
fi

# Model parallelism arguments
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP_SIZE
    --context-parallel-size $CP_SIZE
    --pipeline-model-parallel-size $PP_SIZE
    --expert-model-parallel-size $EP_SIZE  # For MoE expert parallelism
    --sequence-parallel
)

# Distributed Data Parallel (DDP) arguments
# From original script's ddp_args
DDP_ARGS=(
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
)
TRAINING_ARGS+=("${DDP_ARGS[@]}")


# Data arguments (conditional for mock vs real data)
DATA_ARGS_LIST=()
if [[ "$TOKENIZER_ARG" == "MOCK" ]] || [[ "$DATA_ARG" == "MOCK" ]] || [[ -z "$TOKENIZER_ARG" ]]; then
    DATA_ARGS_LIST+=(
        "--mock-data"
        "--tokenizer-type NullTokenizer"
        "--vocab-size 128256" 
        "--data-cache-path ${DATA_CACHE_PATH}"
        "--tiktoken-pattern v2" 
        "--split '99,1,0'"
        "--no-create-attention-mask-in-dataloader"
        "--no-mmap-bin-files"
        "--num-workers 1"
    )
else
    # Settings for real data
    DATA_ARGS_LIST+=(
        "--data-path $DATA_ARG"
        "--tokenizer-type HuggingFaceTokenizer" 
        "--tokenizer-model $TOKENIZER_ARG"
        "--data-cache-path ${DATA_CACHE_PATH}"
        "--split '99,1,0'"
        "--no-create-attention-mask-in-dataloader"
        # "--no-mmap-bin-files"
        "--num-workers 8"  # Reference script uses 8 workers
        # Note: --vocab-size might be inferred by HuggingFaceTokenizer or might need to be explicit.
        "--vocab-size 128256"
    )
fi

EVAL_AND_LOGGING_ARGS=(
    --log-interval 1
    --eval-iters 32
    --eval-interval 100
    --save-interval 1000
    --log-throughput
    # --profile
    # --profile-step-start 4
    # --profile-step-end 6
    --ckpt-format torch_dist 
    --distributed-timeout-minutes 120
    --save "$CHECKPOINT_PATH"
    # --load "$CHECKPOINT_PATH" 
    --tensorboard-dir "$TENSORBOARD_LOGS_PATH"
)

# Ensure pretrain_gpt.py is found
if [ ! -f "$PRETRAIN_SCRIPT_PATH" ]; then
    echo "Error: pretrain_gpt.py not found at $PRETRAIN_SCRIPT_PATH"
    echo "Please ensure you are running this script from the root of the Megatron-LM repository, and pretrain_gpt.py is present."
    exit 1
fi

# Run the training command
torchrun ${DISTRIBUTED_ARGS[@]} \
    "$PRETRAIN_SCRIPT_PATH" \
    ${GPT_ARGS[@]} \
    ${MLA_ARGS[@]} \
    ${ROPE_ARGS[@]} \
    ${MOE_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${DTYPE_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${DATA_ARGS_LIST[@]} \
    ${EVAL_AND_LOGGING_ARGS[@]}

set +x
