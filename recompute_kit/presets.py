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
        ),
        parallel=ParallelConfig(
            tensor_model_parallel_size=8, pipeline_model_parallel_size=4, sequence_parallel=True
        ),
        runnable=False,
        source="meta-llama/Meta-Llama-3-70B config.json",
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
