"""Named model shapes: tiny ones that run on a CPU in well under a second, and real ones for
estimation (shape only: building them would need hundreds of GB)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .config import Config, ConfigError, ModelConfig, ParallelConfig


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    model: ModelConfig
    runnable: bool  # small enough to build and run on a CPU
    source: str  # where the shape comes from
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def config(self) -> Config:
        """A fresh Config for this preset (safe to modify)."""
        return Config().replace(**asdict(self.model), **asdict(self.parallel))


PRESETS: dict[str, Preset] = {}


def _register(preset: Preset) -> None:
    PRESETS[preset.name] = preset


_register(
    Preset(
        name="tiny-gpt",
        description="4-layer GPT with GQA, GeLU, LayerNorm, unfused attention, dropout 0.1",
        model=ModelConfig(
            num_layers=4,
            hidden_size=64,
            num_attention_heads=4,
            num_query_groups=2,
            ffn_hidden_size=256,
            seq_length=32,
            micro_batch_size=2,
            vocab_size=128,
            hidden_dropout=0.1,
            attention_dropout=0.1,
            normalization="LayerNorm",
            attention_backend="unfused",
        ),
        runnable=True,
        source="recompute-kit test model",
    )
)

_register(
    Preset(
        name="gpt3-175b",
        description="GPT-3 175B as in Korthikanti et al. (2022), TP8 PP8, unfused attention",
        model=ModelConfig(
            num_layers=96,
            hidden_size=12288,
            num_attention_heads=96,
            ffn_hidden_size=4 * 12288,
            seq_length=2048,
            micro_batch_size=1,
            vocab_size=51200,
            hidden_dropout=0.1,
            attention_dropout=0.1,
            normalization="LayerNorm",
            attention_backend="unfused",
            bf16=True,
            # Megatron-LM's command-line defaults (TransformerConfig's are off)
            bias_activation_fusion=True,
            masked_softmax_fusion=True,
        ),
        parallel=ParallelConfig(
            tensor_model_parallel_size=8, pipeline_model_parallel_size=8, sequence_parallel=True
        ),
        runnable=False,
        source="arXiv 2205.05198 Table 3 (a=96, h=12288, L=96, t=8, p=8, s=2048, v=51200)",
    )
)

_register(
    Preset(
        name="llama3-8b",
        description="Llama-3 8B: GQA 32/8, SwiGLU 14336, RMSNorm, flash attention, 8k sequence",
        model=ModelConfig(
            num_layers=32,
            hidden_size=4096,
            num_attention_heads=32,
            num_query_groups=8,
            ffn_hidden_size=14336,
            seq_length=8192,
            micro_batch_size=1,
            vocab_size=128256,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            normalization="RMSNorm",
            swiglu=True,
            attention_backend="flash",
            bf16=True,
            # Megatron-LM's command-line defaults (TransformerConfig's are off)
            bias_activation_fusion=True,
            masked_softmax_fusion=True,
            add_bias_linear=False,
            position_embedding_type="rope",
            apply_rope_fusion=True,
        ),
        runnable=False,
        source="meta-llama/Meta-Llama-3-8B config.json",
    )
)

_register(
    Preset(
        name="llama3-70b",
        description="Llama-3 70B: GQA 64/8, SwiGLU 28672, RMSNorm, flash attention, 8k sequence",
        model=ModelConfig(
            num_layers=80,
            hidden_size=8192,
            num_attention_heads=64,
            num_query_groups=8,
            ffn_hidden_size=28672,
            seq_length=8192,
            micro_batch_size=1,
            vocab_size=128256,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            normalization="RMSNorm",
            swiglu=True,
            attention_backend="flash",
            bf16=True,
            # Megatron-LM's command-line defaults (TransformerConfig's are off)
            bias_activation_fusion=True,
            masked_softmax_fusion=True,
            add_bias_linear=False,
            position_embedding_type="rope",
            apply_rope_fusion=True,
        ),
        parallel=ParallelConfig(
            tensor_model_parallel_size=8, pipeline_model_parallel_size=4, sequence_parallel=True
        ),
        runnable=False,
        source="meta-llama/Meta-Llama-3-70B config.json",
    )
)


_register(
    Preset(
        name="tiny-moe",
        description="4-layer MoE GPT: 1 dense + 3 MoE layers, 4 experts top-2 + shared expert, "
        "SwiGLU, RMSNorm",
        model=ModelConfig(
            num_layers=4,
            hidden_size=64,
            num_attention_heads=4,
            num_query_groups=2,
            ffn_hidden_size=128,
            seq_length=32,
            micro_batch_size=2,
            vocab_size=128,
            hidden_dropout=0.1,
            attention_dropout=0.1,
            normalization="RMSNorm",
            swiglu=True,
            attention_backend="unfused",
            num_moe_experts=4,
            moe_router_topk=2,
            moe_ffn_hidden_size=48,
            moe_shared_expert_intermediate_size=32,
            moe_grouped_gemm=True,
            moe_layer_freq=[0, 1, 1, 1],
            moe_aux_loss_coeff=0.01,
        ),
        runnable=True,
        source="recompute-kit test model (Mixtral/Qwen-MoE-like, scaled down)",
    )
)

_register(
    Preset(
        name="tiny-mla",
        description="3-layer DeepSeek-like model: MLA (q/kv latents + decoupled RoPE), 1 dense + "
        "2 MoE layers with sigmoid routing and a shared expert",
        model=ModelConfig(
            num_layers=3,
            hidden_size=64,
            num_attention_heads=4,
            ffn_hidden_size=128,
            seq_length=32,
            micro_batch_size=2,
            vocab_size=128,
            hidden_dropout=0.1,
            attention_dropout=0.1,
            normalization="RMSNorm",
            swiglu=True,
            attention_backend="unfused",
            multi_latent_attention=True,
            qk_layernorm=True,  # the q and kv latent norms
            q_lora_rank=32,
            kv_lora_rank=24,
            qk_head_dim=16,
            qk_pos_emb_head_dim=8,
            v_head_dim=16,
            num_moe_experts=4,
            moe_router_topk=2,
            moe_ffn_hidden_size=32,
            moe_shared_expert_intermediate_size=32,
            moe_grouped_gemm=True,
            moe_layer_freq=[0, 1, 1],
            moe_router_score_function="sigmoid",
        ),
        runnable=True,
        source="recompute-kit test model (DeepSeek-V3 layout, scaled down)",
    )
)

_register(
    Preset(
        name="mixtral-8x7b",
        description="Mixtral 8x7B: 32 layers, 8 experts top-2 (SwiGLU 14336), GQA 32/8",
        model=ModelConfig(
            num_layers=32,
            hidden_size=4096,
            num_attention_heads=32,
            num_query_groups=8,
            ffn_hidden_size=14336,
            seq_length=4096,
            micro_batch_size=1,
            vocab_size=32000,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            normalization="RMSNorm",
            swiglu=True,
            attention_backend="flash",
            bf16=True,
            # Megatron-LM's command-line defaults (TransformerConfig's are off)
            bias_activation_fusion=True,
            masked_softmax_fusion=True,
            add_bias_linear=False,
            position_embedding_type="rope",
            apply_rope_fusion=True,
            num_moe_experts=8,
            moe_router_topk=2,
            moe_ffn_hidden_size=14336,
            moe_grouped_gemm=True,
        ),
        runnable=False,
        source="mistralai/Mixtral-8x7B-v0.1 config.json (num_local_experts 8, "
        "num_experts_per_tok 2, intermediate_size 14336)",
    )
)

_register(
    Preset(
        name="qwen3-30b-a3b",
        description="Qwen3-30B-A3B: 48 MoE layers, 128 experts top-8 (768), GQA 32/4, head dim 128",
        model=ModelConfig(
            num_layers=48,
            hidden_size=2048,
            num_attention_heads=32,
            num_query_groups=4,
            kv_channels=128,
            ffn_hidden_size=6144,
            seq_length=4096,
            micro_batch_size=1,
            vocab_size=151936,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            normalization="RMSNorm",
            swiglu=True,
            attention_backend="flash",
            bf16=True,
            # Megatron-LM's command-line defaults (TransformerConfig's are off)
            bias_activation_fusion=True,
            masked_softmax_fusion=True,
            add_bias_linear=False,
            position_embedding_type="rope",
            apply_rope_fusion=True,
            qk_layernorm=True,
            num_moe_experts=128,
            moe_router_topk=8,
            moe_ffn_hidden_size=768,
            moe_grouped_gemm=True,
        ),
        runnable=False,
        source="Qwen/Qwen3-30B-A3B config.json (num_experts 128, num_experts_per_tok 8, "
        "moe_intermediate_size 768, head_dim 128, q/k RMSNorm)",
    )
)

_register(
    Preset(
        name="deepseek-v3",
        description="DeepSeek-V3 671B: 61 layers (3 dense + 58 MoE), MLA, 256 experts top-8 "
        "(2048) + 1 shared, sigmoid routing",
        model=ModelConfig(
            num_layers=61,
            hidden_size=7168,
            num_attention_heads=128,
            ffn_hidden_size=18432,
            seq_length=4096,
            micro_batch_size=1,
            vocab_size=129280,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            normalization="RMSNorm",
            swiglu=True,
            attention_backend="flash",
            bf16=True,
            # Megatron-LM's command-line defaults (TransformerConfig's are off)
            bias_activation_fusion=True,
            masked_softmax_fusion=True,
            add_bias_linear=False,
            position_embedding_type="rope",
            apply_rope_fusion=True,
            multi_latent_attention=True,
            qk_layernorm=True,  # the q and kv latent norms
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_head_dim=128,
            qk_pos_emb_head_dim=64,
            v_head_dim=128,
            num_moe_experts=256,
            moe_router_topk=8,
            moe_ffn_hidden_size=2048,
            moe_shared_expert_intermediate_size=2048,
            moe_grouped_gemm=True,
            moe_layer_freq=[0] * 3 + [1] * 58,
            moe_router_score_function="sigmoid",
        ),
        # 61 layers split unevenly over pipeline stages in practice (not modelled): no PP here.
        parallel=ParallelConfig(
            tensor_model_parallel_size=2, expert_model_parallel_size=64, sequence_parallel=True
        ),
        runnable=False,
        source="deepseek-ai/DeepSeek-V3 config.json (first_k_dense_replace 3, n_routed_experts "
        "256, n_shared_experts 1, moe_intermediate_size 2048, q_lora_rank 1536, kv_lora_rank 512)",
    )
)

_register(
    Preset(
        name="moonlight-16b",
        description="Moonlight-16B-A3B: 27 layers (1 dense + 26 MoE), MLA without q latent, 64 "
        "experts top-6 (1408) + 2 shared",
        model=ModelConfig(
            num_layers=27,
            hidden_size=2048,
            num_attention_heads=16,
            ffn_hidden_size=11264,
            seq_length=4096,
            micro_batch_size=1,
            vocab_size=163840,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            normalization="RMSNorm",
            swiglu=True,
            attention_backend="flash",
            bf16=True,
            # Megatron-LM's command-line defaults (TransformerConfig's are off)
            bias_activation_fusion=True,
            masked_softmax_fusion=True,
            add_bias_linear=False,
            position_embedding_type="rope",
            apply_rope_fusion=True,
            multi_latent_attention=True,
            qk_layernorm=True,  # the q and kv latent norms
            q_lora_rank=None,
            kv_lora_rank=512,
            qk_head_dim=128,
            qk_pos_emb_head_dim=64,
            v_head_dim=128,
            num_moe_experts=64,
            moe_router_topk=6,
            moe_ffn_hidden_size=1408,
            moe_shared_expert_intermediate_size=2816,
            moe_grouped_gemm=True,
            moe_layer_freq=[0] + [1] * 26,
            moe_router_score_function="sigmoid",
        ),
        runnable=False,
        source="moonshotai/Moonlight-16B-A3B config.json (DeepSeek-V3 architecture; "
        "first_k_dense_replace 1, n_shared_experts 2 x 1408)",
    )
)


def get_preset(name: str) -> Preset:
    """Look a preset up by name; unknown names raise ConfigError listing the choices."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown preset {name!r}; choose from {', '.join(PRESETS)} (or pass --config FILE)"
        ) from None
