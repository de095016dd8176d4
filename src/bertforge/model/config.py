"""Model architecture: `BertConfig` (the fields of a Hugging Face `config.json`) and the size presets."""

from __future__ import annotations

import dataclasses
from typing import Any

from bertforge.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ModelSize:
    layers: int
    hidden: int
    heads: int


# Sizes from Turc et al. 2019 (tiny/mini/small/medium) and Devlin et al. 2018 (base/large);
# intermediate = 4 x hidden for all of them.
MODEL_PRESETS: dict[str, ModelSize] = {
    "tiny": ModelSize(layers=2, hidden=128, heads=2),
    "mini": ModelSize(layers=4, hidden=256, heads=4),
    "small": ModelSize(layers=4, hidden=512, heads=8),
    "medium": ModelSize(layers=8, hidden=512, heads=8),
    "base": ModelSize(layers=12, hidden=768, heads=12),
    "large": ModelSize(layers=24, hidden=1024, heads=16),
}


@dataclasses.dataclass
class BertConfig:
    """The architecture of a BERT or RoBERTa encoder, named as in Hugging Face's `config.json`."""

    vocab_size: int = 30522
    """Rows of the word-embedding table (NVIDIA pads 30522 to 30528; both load)."""
    hidden_size: int = 768
    """Width of every token representation."""
    num_hidden_layers: int = 12
    """Number of encoder layers."""
    num_attention_heads: int = 12
    """Attention heads per layer; hidden_size must divide by it."""
    intermediate_size: int = 3072
    """Width of the feed-forward block (4 x hidden in every preset)."""
    hidden_act: str = "gelu"
    """Feed-forward activation; BERT uses the exact (erf) GELU."""
    hidden_dropout_prob: float = 0.1
    """Dropout on embeddings and sub-layer outputs."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on attention probabilities."""
    max_position_embeddings: int = 512
    """Learned position embeddings (RoBERTa: max length + padding_idx + 1)."""
    type_vocab_size: int = 2
    """Segment (token type) embeddings; RoBERTa has 1."""
    initializer_range: float = 0.02
    """Std of the normal init of weights (BERT: 0.02)."""
    layer_norm_eps: float = 1e-12
    """LayerNorm epsilon (BERT: 1e-12, RoBERTa: 1e-5)."""
    pad_token_id: int = 0
    """Id of [PAD]; its embedding row is zero at init. RoBERTa: 1, also its padding_idx for positions."""
    model_type: str = "bert"
    """bert or roberta: RoBERTa offsets positions by pad_token_id + 1."""

    def __post_init__(self) -> None:
        if self.model_type not in ("bert", "roberta"):
            raise ConfigError(f"model_type must be bert or roberta, not {self.model_type!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_attention_heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> BertConfig:
        if name not in MODEL_PRESETS:
            raise ConfigError(f"unknown model preset {name!r}; choose one of {', '.join(MODEL_PRESETS)}")
        size = MODEL_PRESETS[name]
        return cls(
            num_hidden_layers=size.layers,
            hidden_size=size.hidden,
            num_attention_heads=size.heads,
            intermediate_size=4 * size.hidden,
            **overrides,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
