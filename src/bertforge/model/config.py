"""Model architecture: `BertConfig` (the fields of a Hugging Face `config.json`) and the size presets.

Three encoder families share one config and one model (`model_type`): BERT, RoBERTa (BERT with fairseq's
position rule) and ModernBERT (Warner et al. 2024, arXiv 2412.13663: rotary positions, GeGLU, pre-norm with a
final norm, no biases, a global attention layer every N layers and sliding-window attention in the others).
Fields that only ModernBERT reads are listed in `MODERN_FIELDS` and carry ModernBERT's own defaults.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bertforge.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ModelSize:
    layers: int
    hidden: int
    heads: int
    intermediate: int | None = None
    """Feed-forward width; None: 4 x hidden (BERT)."""
    model_type: str = "bert"
    defaults: tuple[tuple[str, Any], ...] = ()
    """Other BertConfig fields of the preset (overrides passed to `from_preset` win)."""


# ModernBERT's published config.json values (answerdotai/ModernBERT-base and -large): the GPT-NeoX-based BPE
# vocab of 50,368 (a multiple of 64), 8,192 positions, LayerNorm eps 1e-5, no dropout, and sequence
# classification by the mean of the real tokens (AnswerDotAI/ModernBERT's convert_to_hf.py writes
# classifier_pooling "mean"; transformers' ModernBertConfig defaults to "cls", so it must be stated). The padding
# id (50283 in the published tokenizer) belongs to the vocab a run trains with, so the preset leaves it at 0.
_MODERN = (
    ("vocab_size", 50368),
    ("max_position_embeddings", 8192),
    ("layer_norm_eps", 1e-5),
    ("hidden_dropout_prob", 0.0),
    ("attention_probs_dropout_prob", 0.0),
    ("classifier_pooling", "mean"),
)


# Sizes from Turc et al. 2019 (tiny/mini/small/medium) and Devlin et al. 2018 (base/large);
# intermediate = 4 x hidden for all of them.
MODEL_PRESETS: dict[str, ModelSize] = {
    "tiny": ModelSize(layers=2, hidden=128, heads=2),
    "mini": ModelSize(layers=4, hidden=256, heads=4),
    "small": ModelSize(layers=4, hidden=512, heads=8),
    "medium": ModelSize(layers=8, hidden=512, heads=8),
    "base": ModelSize(layers=12, hidden=768, heads=12),
    "large": ModelSize(layers=24, hidden=1024, heads=16),
    # Warner et al. 2024, Table 8 / the published config.json: base 22 x 768 (GeGLU width 1152, 12 heads),
    # large 28 x 1024 (2624, 16 heads). The tiny one (head size 64 as base; 4 layers = global, local, local,
    # global) is for tests and the demo.
    "modernbert-tiny": ModelSize(
        layers=4, hidden=128, heads=2, intermediate=256, model_type="modernbert", defaults=_MODERN
    ),
    "modernbert-base": ModelSize(
        layers=22, hidden=768, heads=12, intermediate=1152, model_type="modernbert", defaults=_MODERN
    ),
    "modernbert-large": ModelSize(
        layers=28, hidden=1024, heads=16, intermediate=2624, model_type="modernbert", defaults=_MODERN
    ),
}

MODEL_TYPES = ("bert", "roberta", "modernbert")
# every dropout rate of the config; the last two may be None (follow hidden_dropout_prob)
DROPOUT_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout", "embedding_dropout")
# read by ModernBERT only; BERT/RoBERTa config.json files do not carry them
MODERN_FIELDS = (
    "norm_bias",
    "attention_bias",
    "mlp_bias",
    "decoder_bias",
    "classifier_bias",
    "classifier_pooling",
    "classifier_activation",
    "local_attention",
    "global_attn_every_n_layers",
    "global_rope_theta",
    "local_rope_theta",
    "initializer_cutoff_factor",
    "embedding_dropout",
)


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
    """Dropout on embeddings and sub-layer outputs (ModernBERT: inside the MLP, its config.json's mlp_dropout)."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on attention probabilities (ModernBERT: and on the attention output, its attention_dropout)."""
    classifier_dropout: float | None = None
    """Dropout of the task heads before their output layer (sequence and token classification; ModernBERT's
    question answering too), Hugging Face's field of the same name; None: hidden_dropout_prob, as transformers'
    BERT and RoBERTa heads read a null. Use `classifier_dropout_rate`."""
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
    """bert, roberta (positions offset by pad_token_id + 1) or modernbert."""
    # ---- ModernBERT only (MODERN_FIELDS); defaults as Hugging Face's ModernBertConfig
    norm_bias: bool = False
    """LayerNorms with a bias (ModernBERT: none)."""
    attention_bias: bool = False
    """Biases on the attention projections Wqkv and Wo."""
    mlp_bias: bool = False
    """Biases on the GeGLU projections Wi and Wo."""
    decoder_bias: bool = True
    """An output bias on the tied MLM decoder."""
    classifier_bias: bool = False
    """A bias on the dense layer of the prediction head (`head.dense`) that every task head starts with."""
    classifier_pooling: str = "cls"
    """Sequence classification reads the first token (cls) or the mean over the real tokens (mean)."""
    classifier_activation: str = "gelu"
    """Activation of the prediction head (`head`)."""
    local_attention: int = 128
    """Sliding-window width of the local layers: a token sees the tokens within local_attention // 2 of it."""
    global_attn_every_n_layers: int = 3
    """Layer i attends globally when i % N == 0, in a sliding window otherwise."""
    global_rope_theta: float = 160000.0
    """Rotary base of the global layers (ModernBERT: 160,000, raised for the 8,192-token phase)."""
    local_rope_theta: float = 10000.0
    """Rotary base of the local layers."""
    initializer_cutoff_factor: float = 2.0
    """The init's truncated normal is cut at this many standard deviations (transformers' name and default)."""
    embedding_dropout: float | None = None
    """Dropout on the embeddings' output (transformers' name); None: hidden_dropout_prob, as BERT's embeddings.
    Use `embedding_dropout_rate`."""

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ConfigError(f"model_type must be one of {', '.join(MODEL_TYPES)}, not {self.model_type!r}")
        sizes = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
        for name in (*sizes, "max_position_embeddings", "type_vocab_size"):
            if getattr(self, name) < 1:  # before the division below, and before torch builds empty tensors
                raise ConfigError(f"{name} must be at least 1, not {getattr(self, name)}")
        for name in DROPOUT_FIELDS:
            rate = getattr(self, name)
            if rate is None and name in ("classifier_dropout", "embedding_dropout"):
                continue  # follows hidden_dropout_prob
            # a bool is an int to Python, never a rate; a string would fail the comparison with a TypeError
            if not isinstance(rate, (int, float)) or isinstance(rate, bool):
                raise ConfigError(f"{name} must be a number in [0, 1), not {rate!r}")
            if not 0 <= rate < 1:
                raise ConfigError(f"{name} must be in [0, 1), not {rate}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_attention_heads}"
            )
        if self.modern and (self.head_dim % 2 or self.local_attention < 2 or self.global_attn_every_n_layers < 1):
            raise ConfigError(
                "ModernBERT needs an even head size (rotary pairs), local_attention >= 2 and "
                f"global_attn_every_n_layers >= 1 (got {self.head_dim}, {self.local_attention}, "
                f"{self.global_attn_every_n_layers})"
            )
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"pad_token_id {self.pad_token_id} is outside the vocabulary of {self.vocab_size}")
        if self.initializer_cutoff_factor <= 0:
            raise ConfigError(f"initializer_cutoff_factor must be > 0, not {self.initializer_cutoff_factor}")
        if self.classifier_pooling not in ("cls", "mean"):
            raise ConfigError(f"classifier_pooling must be cls or mean, not {self.classifier_pooling!r}")

    @property
    def classifier_dropout_rate(self) -> float:
        """The rate of the task heads' dropout: classifier_dropout, or hidden_dropout_prob when it is None."""
        return self.hidden_dropout_prob if self.classifier_dropout is None else self.classifier_dropout

    @property
    def embedding_dropout_rate(self) -> float:
        """The rate of the embeddings' dropout: embedding_dropout (ModernBERT), or hidden_dropout_prob."""
        rate = self.embedding_dropout if self.modern else None
        return self.hidden_dropout_prob if rate is None else rate

    @property
    def modern(self) -> bool:
        """ModernBERT's layer, embeddings and heads (rather than BERT's)."""
        return self.model_type == "modernbert"

    @property
    def layer_types(self) -> list[str]:
        """Per layer, as Hugging Face names them: full_attention, or sliding_attention (ModernBERT's local layers)."""
        n = self.global_attn_every_n_layers if self.modern else 1
        return ["sliding_attention" if i % n else "full_attention" for i in range(self.num_hidden_layers)]

    @property
    def usable_positions(self) -> int:
        """The longest sequence the position table takes: RoBERTa's positions start after its padding index
        (fairseq's make_positions), so its 514 rows hold 512 tokens."""
        offset = self.pad_token_id + 1 if self.model_type == "roberta" else 0
        return self.max_position_embeddings - offset

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> BertConfig:
        if name not in MODEL_PRESETS:
            raise ConfigError(f"unknown model preset {name!r}; choose one of {', '.join(MODEL_PRESETS)}")
        size = MODEL_PRESETS[name]
        kw: dict[str, Any] = {
            "num_hidden_layers": size.layers,
            "hidden_size": size.hidden,
            "num_attention_heads": size.heads,
            "intermediate_size": size.intermediate or 4 * size.hidden,
            "model_type": size.model_type,
            **dict(size.defaults),
        }
        return cls(**{**kw, **overrides})

    def replace(self, **changes: Any) -> BertConfig:
        """A copy with `changes` (fields by name), validated. The one owner of the rule that the hidden rate is the
        embeddings' rate too (model.hidden_dropout: "embeddings and sub-layer outputs", as in BERT): a ModernBERT
        given a new hidden_dropout_prob without an embedding_dropout of its own follows it (None), as a preset
        built with that rate does, rather than keep the old config's (a ModernBERT config.json states its
        embedding_dropout). classifier_dropout stays (a null one follows the hidden rate, as in transformers)."""
        if self.modern and "hidden_dropout_prob" in changes:
            changes.setdefault("embedding_dropout", None)
        return BertConfig(**{**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        """The fields this model type uses (BERT/RoBERTa leave out MODERN_FIELDS)."""
        out = dataclasses.asdict(self)
        return out if self.modern else {k: v for k, v in out.items() if k not in MODERN_FIELDS}
