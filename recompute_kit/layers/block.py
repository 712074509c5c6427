"""Transformer layer, transformer block and GPT model.

The layer is pre-norm: x + dropout(attention(norm(x))), then x + dropout(mlp(norm(x))).
Recompute decisions come from the shared `RecomputePolicy`: the layer asks it about
`layernorm` and `mlp`, the attention about `core_attn`, the block about full recompute.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checkpoint import RecomputePolicy, checkpoint
from ..config import Config, ModelConfig, RecomputeConfig
from . import ops
from .attention import MLASelfAttention, SelfAttention
from .mlp import MLP
from .moe import MoELayer
from .norm import LayerNormUnit, make_norm


class TransformerLayer(nn.Module):
    """Attention is MLA or MHA/GQA; the feed-forward is a dense MLP or an MoE layer.

    The norms, the core attention, the MLP/MoE and their parts are recompute units that apply
    the shared policy themselves; the layer only wires them up.
    """

    def __init__(self, config: ModelConfig, policy: RecomputePolicy, is_moe: bool = False):
        super().__init__()
        self.is_moe = is_moe
        self.hidden_dropout = config.hidden_dropout
        norm, hidden = config.normalization, config.hidden_size
        self.input_layernorm = LayerNormUnit(norm, hidden, policy, offload_unit="attn_norm")
        attention = MLASelfAttention if config.multi_latent_attention else SelfAttention
        self.self_attention = attention(config, policy)
        self.pre_mlp_layernorm = LayerNormUnit(norm, hidden, policy, offload_unit="mlp_norm")
        if is_moe:  # Megatron's 'mlp' recompute is a no-op here; 'moe' covers the layer
            self.mlp = MoELayer(config, policy)
        else:
            self.mlp = MLP(hidden, config.ffn_size, config.swiglu, policy, "mlp")

    def forward(self, x: Tensor) -> Tensor:
        # With 'layernorm' recompute the norm output is freed once its consumer saved it, and
        # rebuilt when the gradient of the sub-block's output arrives.
        attention_out = self.self_attention(self.input_layernorm(x))
        self.input_layernorm.discard_output(attention_out)
        x = x + ops.dropout(attention_out, self.hidden_dropout, self.training)

        mlp_out = self.mlp(self.pre_mlp_layernorm(x))
        self.pre_mlp_layernorm.discard_output(mlp_out)
        return x + ops.dropout(mlp_out, self.hidden_dropout, self.training)


class TransformerBlock(nn.Module):
    """A stack of layers; applies full recompute (uniform or block) when configured."""

    def __init__(self, layers: list[nn.Module], policy: RecomputePolicy):
        super().__init__()
        self.policy = policy
        self.layers = nn.ModuleList(layers)

    def forward(self, x: Tensor) -> Tensor:
        for start, end, checkpointed in self.policy.full_recompute_chunks(
            len(self.layers), self.training
        ):
            if checkpointed:
                x = checkpoint(self._run_layers, x, start, end)
            else:
                x = self._run_layers(x, start, end)
        return x

    def _run_layers(self, x: Tensor, start: int, end: int) -> Tensor:
        for index in range(start, end):
            with self.policy.offload_layer(index):
                x = self.layers[index](x)
        return x


class Embedding(nn.Module):
    """Token embedding plus learned absolute positions, then dropout."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Parameter(
            torch.randn(config.seq_length, config.hidden_size) * 0.02
        )
        self.dropout = config.hidden_dropout

    def forward(self, tokens: Tensor) -> Tensor:
        seq = tokens.shape[1]
        x = self.word_embeddings(tokens) + self.position_embeddings[:seq]
        return ops.dropout(x, self.dropout, self.training)


class CrossEntropyLoss(nn.Module):
    """Mean token cross-entropy computed in fp32, as Megatron does (the fp32 logits term)."""

    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def build_layers(config: ModelConfig, policy: RecomputePolicy) -> list[nn.Module]:
    return [
        TransformerLayer(config, policy, is_moe=config.is_moe_layer(i))
        for i in range(config.num_layers)
    ]


class GPTModel(nn.Module):
    """Embedding, transformer block, final norm, output layer and loss."""

    def __init__(self, config: Config):
        super().__init__()
        model = config.model
        self.config = config
        self.policy = RecomputePolicy(config.recompute)
        self.embedding = Embedding(model)
        self.decoder = TransformerBlock(build_layers(model, self.policy), self.policy)
        self.final_layernorm = make_norm(model.normalization, model.hidden_size)
        self.output_layer = nn.Linear(model.hidden_size, model.vocab_size, bias=False)
        self.loss = CrossEntropyLoss()

    def set_recompute(self, recompute: RecomputeConfig) -> None:
        """Switch recompute settings in place (the weights stay as they are)."""
        self.policy.config = recompute
        self.config = Config(self.config.model, self.config.parallel, recompute)

    def forward(self, tokens: Tensor, labels: Tensor | None = None) -> Tensor:
        self.policy.offloaded.reset()
        x = self.embedding(tokens)
        x = self.decoder(x)
        logits = self.output_layer(self.final_layernorm(x))
        return logits if labels is None else self.loss(logits, labels)
