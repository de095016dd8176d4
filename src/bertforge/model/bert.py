"""BERT / RoBERTa encoder: embeddings, post-LN encoder layers with a fused QKV projection, pooler.

Exactly the original architecture (Devlin et al. 2018; Google's modeling.py; Hugging Face `BertModel`):
post-LayerNorm residual blocks, exact (erf) GELU, LayerNorm eps from the config (BERT 1e-12), weights
initialised normal(0, initializer_range = 0.02), LayerNorm 1/0, biases 0, the padding row of the word
embeddings zero. Parameter names follow Hugging Face's so checkpoints read naturally; the one difference is
`attention.qkv`, the query/key/value projections fused into one (3H, H) matmul (DESIGN §4), which
`hf_interop` splits and joins.

RoBERTa (Liu et al. 2019) is the same encoder with its own embedding rules: positions are offset by
`pad_token_id + 1` (fairseq's `make_positions`), and a single token type.

The module holds no device, precision or distributed logic (DESIGN §5.3).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from bertforge.errors import ConfigError
from bertforge.model import attention as attn
from bertforge.model.activations import ACTIVATIONS
from bertforge.model.config import BertConfig
from bertforge.model.dropout import Dropout, fast_dropout_usable
from bertforge.model.heads import TASK_HEADS, ModelOutput


class Embeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        # RoBERTa's position table has a padding row too (fairseq LearnedPositionalEmbedding)
        pos_pad = config.pad_token_id if config.model_type == "roberta" else None
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size, padding_idx=pos_pad)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids=None, position_ids=None) -> torch.Tensor:
        B, T = input_ids.shape
        if self.config.model_type == "roberta":
            pad = self.config.pad_token_id
            if position_ids is None:
                # fairseq/HF rule: real tokens count from pad + 1, padding tokens sit on the padding row
                real = (input_ids != pad).long()
                position_ids = torch.cumsum(real, dim=1) * real + pad  # (B, T)
            else:
                position_ids = position_ids + pad + 1
        elif position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device)[None, :]  # (1, T)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        h = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        h = h + self.position_embeddings(position_ids)  # (B, T, H)
        return self.dropout(self.LayerNorm(h))


class DenseNorm(nn.Module):
    """dense -> dropout -> add residual -> LayerNorm: the post-LN output of both sub-layers."""

    def __init__(self, d_in: int, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(d_in, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, x, residual):
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class SelfAttention(nn.Module):
    def __init__(self, config: BertConfig, impl: str):
        super().__init__()
        self.heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)  # fused query | key | value
        self.output = DenseNorm(config.hidden_size, config)
        self.dropout_p = config.attention_probs_dropout_prob
        self.impl = impl

    def forward(self, h, mask=None, meta: attn.VarlenMeta | None = None):
        p = self.dropout_p if self.training else 0.0
        if meta is None:  # padded (B, T, H)
            ctx = self._padded(self.qkv(h), mask, p)  # (B, T, H)
        elif mask is None:  # unpadded tokens (N, H), varlen flash kernel
            N = h.shape[0]
            q, k, v = self.qkv(h).view(N, 3, self.heads, self.head_dim).unbind(1)  # 3 x (N, nh, D)
            ctx = attn.varlen(q, k, v, meta, p).reshape(N, -1)  # (N, H)
        else:  # unpadded tokens (N, H); attention on the re-padded batch with the block mask
            B, T = meta.shape
            qkv = self.qkv(h)  # (N, 3H): the projection skips the padding
            full = qkv.new_zeros(B * T, qkv.shape[-1]).index_copy(0, meta.indices, qkv)  # (B*T, 3H)
            ctx = self._padded(full.view(B, T, -1), mask, p)  # (B, T, H)
            ctx = ctx.reshape(B * T, -1).index_select(0, meta.indices)  # (N, H)
        return self.output(ctx, h)

    def _padded(self, qkv, mask, p):
        """qkv (B, T, 3H) -> context (B, T, H) with SDPA (or the eager reference) and the block mask."""
        B, T, _ = qkv.shape
        qkv = qkv.view(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, nh, T, D)
        q, k, v = qkv.unbind(0)
        if self.impl == "eager":
            fn = attn.eager
        elif self.impl == "auto" and p > 0 and fast_dropout_usable(q):
            fn = attn.unfused  # training with attention dropout on CPU: SDPA's math fallback, written out
        else:
            fn = attn.sdpa
        return fn(q, k, v, mask, p).transpose(1, 2).reshape(B, T, -1)  # (B, nh, T, D) -> (B, T, H)


class Intermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACTIVATIONS[config.hidden_act]

    def forward(self, h):
        return self.act(self.dense(h))  # (..., I)


class EncoderLayer(nn.Module):
    def __init__(self, config: BertConfig, impl: str):
        super().__init__()
        self.attention = SelfAttention(config, impl)
        self.intermediate = Intermediate(config)
        self.output = DenseNorm(config.intermediate_size, config)

    def forward(self, h, mask=None, meta=None):
        h = self.attention(h, mask, meta)
        return self.output(self.intermediate(h), h)


class Encoder(nn.Module):
    """The stack of layers; activation checkpointing is applied to the layers from outside
    (`bertforge.runtime.activation`)."""

    def __init__(self, config: BertConfig, impl: str):
        super().__init__()
        self.layer = nn.ModuleList(EncoderLayer(config, impl) for _ in range(config.num_hidden_layers))

    def forward(self, h, mask=None, meta=None):
        for layer in self.layer:
            h = layer(h, mask, meta)
        return h


class Pooler(nn.Module):
    """tanh(dense(h)) of a [CLS] vector; BERT's NSP and sequence classification read it."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, cls_hidden):
        return torch.tanh(self.dense(cls_hidden))


class BertEncoderModel(nn.Module):
    """Embeddings + encoder (+ pooler when a head needs it): Hugging Face's `BertModel` / `RobertaModel`."""

    def __init__(self, config: BertConfig, attention: str = "auto", pooler: bool = True):
        super().__init__()
        if config.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"hidden_act {config.hidden_act!r} is not supported; use one of {', '.join(ACTIVATIONS)}")
        self.config = config
        self.attention_impl = attn.resolve_attention(attention)
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config, self.attention_impl)
        self.pooler = Pooler(config) if pooler else None

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None) -> torch.Tensor:
        """-> sequence output (B, T, H). attention_mask: 0 padding, 1..k sequence index (packed rows)."""
        B, T = input_ids.shape
        h = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, H)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        dropout_p = self.config.attention_probs_dropout_prob if self.training else 0.0
        flash = self.attention_impl in ("auto", "varlen") and attn.varlen_usable(h, dropout_p)
        if flash or self.attention_impl == "varlen":
            # no padding compute: every token-wise op (all the matmuls but attention's) runs on the N real
            # tokens; attention runs in the varlen flash kernel, or else padded with SDPA and the block mask
            meta = attn.varlen_meta(attention_mask, lengths=flash)
            flat = h.reshape(B * T, -1).index_select(0, meta.indices)  # (N, H)
            flat = self.encoder(flat, None if flash else attn.block_mask(attention_mask), meta)
            out = flat.new_zeros(B * T, flat.shape[-1]).index_copy(0, meta.indices, flat)
            return out.view(B, T, -1)  # (B, T, H), zeros at padding
        return self.encoder(h, attn.block_mask(attention_mask))


def init_weights(module: nn.Module, config: BertConfig) -> None:
    """BERT's init (Google modeling.py / HF `_init_weights`): N(0, 0.02) weights, zero bias, LayerNorm 1/0."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, config.initializer_range)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, config.initializer_range)
            if m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class BertForTask(nn.Module):
    """The encoder (`bert`) plus the head of one task from `TASK_HEADS`, registered under the head's Hugging
    Face name (`cls`, `qa_outputs` or `classifier`); `forward` returns a `ModelOutput`."""

    hf_load_info: dict[str, list[str]]
    """Set by `hf_interop.load_hf_state_dict`: checkpoint keys `ignored` and head weights `initialised` fresh."""

    def __init__(self, config: BertConfig, task: str, num_labels: int = 2, attention: str = "auto"):
        super().__init__()
        if task not in TASK_HEADS:
            raise ConfigError(f"unknown task {task!r}; choose one of {', '.join(TASK_HEADS)}")
        spec = TASK_HEADS[task]
        self.config, self.task = config, task
        self.num_labels = spec.fixed_labels or num_labels
        self.bert = BertEncoderModel(config, attention, pooler=spec.pooler)
        self.add_module(spec.name, spec.build(config, self.num_labels))
        init_weights(self, config)

    @property
    def attention_impl(self) -> str:
        return self.bert.attention_impl

    @property
    def head(self) -> nn.Module:
        return getattr(self, TASK_HEADS[self.task].name)

    def forward(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        *,
        masked_positions=None,
        masked_labels=None,
        nsp_positions=None,
        nsp_labels=None,
        labels=None,
        start_positions=None,
        end_positions=None,
    ) -> ModelOutput:
        seq = self.bert(input_ids, attention_mask, token_type_ids, position_ids)  # (B, T, H)
        batch = {
            "masked_positions": masked_positions,
            "masked_labels": masked_labels,
            "nsp_positions": nsp_positions,
            "nsp_labels": nsp_labels,
            "labels": labels,
            "start_positions": start_positions,
            "end_positions": end_positions,
        }
        # the encoder's pieces a head shares: they keep their one name here and are passed, not registered twice
        shared = {
            "decoder_weight": self.bert.embeddings.word_embeddings.weight,  # (V, H), the tied MLM decoder
            "pooler": self.bert.pooler,
        }
        out = self.head(seq, batch, **{k: shared[k] for k in TASK_HEADS[self.task].inputs})
        out.last_hidden_state = seq
        return out


def build_model(config: BertConfig, task: str, num_labels: int = 2, attention: str = "auto") -> BertForTask:
    """A freshly initialised model for `task` (a key of `TASK_HEADS`); see `BertForTask.forward` for inputs.
    Activation checkpointing, compile, precision and DDP are applied to it from outside (DESIGN §2)."""
    return BertForTask(config, task, num_labels, attention)
