"""BERT / RoBERTa / ModernBERT encoders: embeddings, encoder layers with a fused QKV projection, pooler.

Exactly the original architecture (Devlin et al. 2018; Google's modeling.py; Hugging Face `BertModel`):
post-LayerNorm residual blocks, exact (erf) GELU, LayerNorm eps from the config (BERT 1e-12), weights
initialised normal(0, initializer_range = 0.02), LayerNorm 1/0, biases 0, the padding row of the word
embeddings zero. Parameter names follow Hugging Face's so checkpoints read naturally; the one difference is
`attention.qkv`, the query/key/value projections fused into one (3H, H) matmul (DESIGN §4), which
`hf_interop` splits and joins.

RoBERTa (Liu et al. 2019) is the same encoder with its own embedding rules: positions are offset by
`pad_token_id + 1` (fairseq's `make_positions`), and a single token type.

ModernBERT (Warner et al. 2024) is a row of `ARCHITECTURES`, not a second model class: its own embeddings
(no positions) and pre-norm layer (rotary, GeGLU, no biases, local/global attention), a final norm, no pooler,
with Hugging Face `ModernBertModel`'s parameter names inside them. The encoder loop, unpadding, the heads
and the interop are the same code for all three.

The module holds no device, precision or distributed logic (DESIGN §5.3).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn as nn

from bertforge.errors import ConfigError
from bertforge.model import attention as attn
from bertforge.model.activations import ACTIVATIONS
from bertforge.model.config import BertConfig
from bertforge.model.dropout import Dropout
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

    @property
    def tokens(self) -> nn.Embedding:
        """The word embeddings (the MLM decoder is tied to them)."""
        return self.word_embeddings

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
        self.heads = config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)  # fused query | key | value
        self.output = DenseNorm(config.hidden_size, config)
        self.dropout_p = config.attention_probs_dropout_prob
        self.impl = impl

    def forward(self, h, mask=None, meta: attn.VarlenMeta | None = None):
        """h (B, T, H) padded, or (N, H) unpadded with `meta` (see `attention.attend`) -> the same shape."""
        p = self.dropout_p if self.training else 0.0
        return self.output(attn.attend(self.qkv(h), self.heads, mask, meta, p, self.impl), h)


class Intermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACTIVATIONS[config.hidden_act]

    def forward(self, h):
        return self.act(self.dense(h))  # (..., I)


class EncoderLayer(nn.Module):
    def __init__(self, config: BertConfig, impl: str, index: int = 0):
        super().__init__()
        self.attention = SelfAttention(config, impl)
        self.intermediate = Intermediate(config)
        self.output = DenseNorm(config.intermediate_size, config)

    def forward(self, h, mask=None, meta=None, rope=None):
        h = self.attention(h, mask, meta)  # BERT has no rotary positions: `rope` is always None here
        return self.output(self.intermediate(h), h)


# ------------------------------------------------------------------------------------------- ModernBERT
# Warner et al. 2024 / Hugging Face `ModernBertModel`, with its parameter names: pre-norm residual blocks,
# rotary q/k, GeGLU feed-forward, LayerNorms without bias, no biases on the projections.
def _norm(config: BertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.norm_bias)


class ModernEmbeddings(nn.Module):
    """Token embeddings -> LayerNorm -> dropout; positions enter as rotary angles inside attention."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.norm = _norm(config)
        self.drop = Dropout(config.embedding_dropout_rate)

    @property
    def tokens(self) -> nn.Embedding:
        return self.tok_embeddings

    def forward(self, input_ids, token_type_ids=None, position_ids=None) -> torch.Tensor:
        return self.drop(self.norm(self.tok_embeddings(input_ids)))  # (B, T, H); no token types


class ModernAttention(nn.Module):
    """Wqkv -> rotary q, k -> attention (global, or within local_attention // 2 of the query) -> Wo."""

    def __init__(self, config: BertConfig, impl: str, index: int):
        super().__init__()
        H = config.hidden_size
        self.heads, self.impl = config.num_attention_heads, impl
        self.Wqkv = nn.Linear(H, 3 * H, bias=config.attention_bias)
        self.Wo = nn.Linear(H, H, bias=config.attention_bias)
        self.dropout_p = config.attention_probs_dropout_prob
        self.out_drop = Dropout(config.attention_probs_dropout_prob)  # HF drops Wo's output at the same rate
        local = config.layer_types[index] == "sliding_attention"
        self.half_window = config.local_attention // 2 if local else None

    def forward(self, h, mask, meta, rope):
        p = self.dropout_p if self.training else 0.0
        ctx = attn.attend(self.Wqkv(h), self.heads, mask, meta, p, self.impl, rope, self.half_window)
        return self.out_drop(self.Wo(ctx))


class GatedMLP(nn.Module):
    """GeGLU (Shazeer 2020): Wo(drop(act(x W_in) * (x W_gate))), W_in | W_gate fused in Wi (2I, H)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.act = ACTIVATIONS[config.hidden_act]
        self.drop = Dropout(config.hidden_dropout_prob)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, h):
        x, gate = self.Wi(h).chunk(2, dim=-1)  # 2 x (..., I)
        return self.Wo(self.drop(self.act(x) * gate))  # (..., H)


class PreNormLayer(nn.Module):
    """h + attn(norm(h)), then h + mlp(norm(h)). Layer 0 has no attention norm: the embeddings end in one."""

    def __init__(self, config: BertConfig, impl: str, index: int):
        super().__init__()
        self.attn_norm = _norm(config) if index else nn.Identity()
        self.attn = ModernAttention(config, impl, index)
        self.mlp_norm = _norm(config)
        self.mlp = GatedMLP(config)

    def forward(self, h, mask=None, meta=None, rope=None):
        h = h + self.attn(self.attn_norm(h), mask, meta, rope)
        return h + self.mlp(self.mlp_norm(h))


@dataclass(frozen=True)
class Architecture:
    """What an encoder family builds; everything else (encoder loop, unpadding, heads, interop) is shared."""

    embeddings: Callable[[BertConfig], nn.Module]
    layer: Callable[[BertConfig, str, int], nn.Module]
    """(config, attention kernel, layer index) -> one encoder layer."""
    final_norm: bool
    """A LayerNorm after the last layer (pre-norm stacks)."""
    rotary: bool
    """Rotary q/k with per-layer-type bases (global_rope_theta / local_rope_theta)."""


ARCHITECTURES: dict[str, Architecture] = {
    "bert": Architecture(Embeddings, EncoderLayer, final_norm=False, rotary=False),
    "roberta": Architecture(Embeddings, EncoderLayer, final_norm=False, rotary=False),
    "modernbert": Architecture(ModernEmbeddings, PreNormLayer, final_norm=True, rotary=True),
}
ENCODER_LAYERS = (EncoderLayer, PreNormLayer)
"""The layer classes, for code applied to every layer (activation checkpointing, regional compilation)."""


def encoder_layers(model: nn.Module, purpose: str) -> list[nn.Module]:
    """The encoder layers of `model`, in order, for something applied to each from outside (activation
    checkpointing, regional compilation); none is an error naming `purpose` rather than a silent no-op."""
    layers: list[nn.Module] = [m for m in model.modules() if isinstance(m, ENCODER_LAYERS)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no encoder layers to {purpose}")
    return layers


class Encoder(nn.Module):
    """The stack of layers; each gets the mask and rotary tables of its kind (`BertConfig.layer_types`).
    Activation checkpointing is applied to the layers from outside (`bertforge.runtime.activation`)."""

    def __init__(self, config: BertConfig, impl: str):
        super().__init__()
        build = ARCHITECTURES[config.model_type].layer
        self.layer = nn.ModuleList(build(config, impl, i) for i in range(config.num_hidden_layers))
        self.kinds = config.layer_types

    def forward(self, h, masks: dict | None = None, meta=None, ropes: dict | None = None):
        for layer, kind in zip(self.layer, self.kinds):
            h = layer(h, masks and masks[kind], meta, ropes and ropes[kind])
        return h


class Pooler(nn.Module):
    """tanh(dense(h)) of a [CLS] vector; BERT's NSP and sequence classification read it."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, cls_hidden):
        return torch.tanh(self.dense(cls_hidden))


class BertEncoderModel(nn.Module):
    """Embeddings + encoder (+ pooler when a head needs it, + final norm for pre-norm stacks): Hugging Face's
    `BertModel` / `RobertaModel` / `ModernBertModel`."""

    def __init__(self, config: BertConfig, attention: str = "auto", pooler: bool = True):
        super().__init__()
        for act in (config.hidden_act, config.classifier_activation if config.modern else "gelu"):
            if act not in ACTIVATIONS:
                raise ConfigError(f"activation {act!r} is not supported; use one of {', '.join(ACTIVATIONS)}")
        self.config = config
        arch = ARCHITECTURES[config.model_type]
        self.attention_impl = attn.resolve_attention(attention)
        self.embeddings = arch.embeddings(config)
        self.encoder = Encoder(config, self.attention_impl)
        self.pooler = Pooler(config) if pooler and not config.modern else None  # ModernBERT has none
        self.final_norm = _norm(config) if arch.final_norm else None
        self.rotary = arch.rotary

    def forward(
        self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, cu_seqlens=None
    ) -> torch.Tensor:
        """-> sequence output (B, T, H). attention_mask: 0 padding, 1..k sequence index (packed rows).
        cu_seqlens: `attention.segment_bounds(attention_mask)`, from the loader; with it, `auto` on the flash
        kernel runs the segmented layout (fixed shapes), and every other path ignores it."""
        B, T = input_ids.shape
        h = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, H)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        flash = self.attention_impl in ("auto", "varlen") and attn.varlen_usable(h, self.config.head_dim)
        ropes = self._ropes(input_ids, position_ids)
        if flash and cu_seqlens is not None and self.attention_impl == "auto":
            return self._segmented(h, cu_seqlens, ropes)
        masks = None if flash else self._masks(attention_mask)
        if flash or self.attention_impl == "varlen":
            # no padding compute: every token-wise op (all the matmuls but attention's) runs on the N real
            # tokens; attention runs in the varlen flash kernel, or else padded with SDPA and the block mask
            meta = attn.varlen_meta(attention_mask, lengths=flash)
            if flash and ropes is not None:  # the kernel sees unpadded q/k: tables (N, 1, D)
                full = (B, T, 1, self.config.head_dim)
                ropes = {k: (_unpad(c.expand(full), meta), _unpad(s.expand(full), meta)) for k, (c, s) in ropes.items()}
            flat = self._finish(self.encoder(_unpad(h, meta), masks, meta, ropes))  # (N, H)
            return attn.repad(flat, meta).view(B, T, -1)  # (B, T, H), zeros at padding
        return self._finish(self.encoder(h, masks, None, ropes))

    def _segmented(self, h, cu_seqlens, ropes) -> torch.Tensor:
        """Every token of the batch in one (B*T, H) stream; attention within the segments of `cu_seqlens` in
        the flash kernel (`attention.segment_bounds`): static shapes, no gather, no host sync."""
        B, T, H = h.shape
        meta = attn.VarlenMeta(None, cu_seqlens, T, (B, T))
        if ropes is not None:  # (B|1, T, 1, D) -> (B*T, 1, D)
            ropes = {k: tuple(x.expand(B, T, 1, -1).reshape(B * T, 1, -1) for x in cs) for k, cs in ropes.items()}
        return self._finish(self.encoder(h.reshape(B * T, H), None, meta, ropes)).view(B, T, H)

    def _finish(self, h):
        return h if self.final_norm is None else self.final_norm(h)

    def _masks(self, attention_mask) -> dict[str, torch.Tensor | attn.BandMask]:
        """One mask per layer kind: the (B, 1, T, T) block mask, and for local layers the same within the
        window, or the blocked `BandMask` on rows long enough for it to pay (memory linear in T)."""
        kinds = set(self.encoder.kinds)
        masks: dict[str, torch.Tensor | attn.BandMask] = {"full_attention": attn.block_mask(attention_mask)}
        if "sliding_attention" in kinds:
            masks["sliding_attention"] = attn.sliding_mask(attention_mask, self.config.local_attention // 2)
        return masks

    def _ropes(self, input_ids, position_ids) -> dict[str, tuple[torch.Tensor, torch.Tensor]] | None:
        """Rotary (cos, sin) per layer kind, (B|1, T, 1, D); positions restart at 0 in every packed sequence
        when the batch gives `position_ids`."""
        if not self.rotary:
            return None
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]  # (1, T)
        c = self.config
        thetas = {"full_attention": c.global_rope_theta, "sliding_attention": c.local_rope_theta}
        return {k: attn.rope_tables(position_ids, c.head_dim, thetas[k]) for k in set(self.encoder.kinds)}


def _unpad(x: torch.Tensor, meta: attn.VarlenMeta) -> torch.Tensor:
    """(B, T, ...) -> (N, ...) at the real tokens."""
    return attn.unpad(x.reshape(-1, *x.shape[2:]), meta)


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


@torch.no_grad()
def trunc_normal(w: torch.Tensor, std: float, cut: float) -> torch.Tensor:
    """N(0, std) cut at +-cut std, in place: a normal draw, with the values outside redrawn until none is. The
    same distribution as `nn.init.trunc_normal_`, which inverts the CDF (erfinv) and is ~13x slower on CPU: 15 s of
    ModernBERT-base's 16 s build, paid again by every load of a checkpoint before its weights replace it. At 2 std
    4.6% fall outside, so a few passes over ever fewer values; a narrow cut (most draws outside) inverts."""
    if cut < 1 or w.is_meta or not w.is_contiguous():
        return nn.init.trunc_normal_(w, 0.0, std, -cut * std, cut * std)
    flat, bound = w.view(-1), cut * std
    flat.normal_(0.0, std)
    where = (flat.abs() > bound).nonzero().squeeze(1)  # (n,) the draws to redo: one pass over the tensor
    redo = torch.empty(len(where), dtype=w.dtype, device=w.device).normal_(0.0, std)
    while bool((bad := redo.abs() > bound).any()):  # then passes over the n alone, ever fewer of them
        redo[bad] = torch.empty(int(bad.sum()), dtype=w.dtype, device=w.device).normal_(0.0, std)
    flat[where] = redo
    return w


def init_modern_weights(module: nn.Module, config: BertConfig) -> None:
    """ModernBERT's init (HF `ModernBertPreTrainedModel._init_weights`): truncated normal at +-2 std
    (`initializer_cutoff_factor`); std 0.02 for embeddings and input projections (Wqkv, Wi), 0.02 / sqrt(2 L) for
    output projections (Wo, the prediction head's dense), hidden**-0.5 for the final classifier; biases 0,
    LayerNorm 1/0."""
    std_in, cut = config.initializer_range, config.initializer_cutoff_factor
    stds = {"in": std_in, "out": std_in / math.sqrt(2.0 * config.num_hidden_layers), "final": config.hidden_size**-0.5}
    for name, m in module.named_modules():
        if isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
            continue
        if not isinstance(m, (nn.Linear, nn.Embedding)):
            continue
        if name.endswith(("Wo", "head.dense", "transform.dense")):
            std = stds["out"]
        elif name in ("classifier", "qa_outputs"):  # the last Linear of a fine-tuning head
            std = stds["final"]
        else:
            std = stds["in"]
        trunc_normal(m.weight, std, cut)
        if isinstance(m, nn.Linear) and m.bias is not None:
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
        if config.modern and spec.hf_class("modernbert") is None:
            raise ConfigError(
                f"ModernBERT has no {task!r} head (no next-sentence prediction): pre-train it with the MLM-only "
                "objective (task mlm)"
            )
        self.config, self.task = config, task
        self.num_labels = spec.fixed_labels or num_labels
        self.bert = BertEncoderModel(config, attention, pooler=spec.pooler)
        self.add_module(spec.name, spec.build(config, self.num_labels))
        (init_modern_weights if config.modern else init_weights)(self, config)

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
        cu_seqlens=None,
    ) -> ModelOutput:
        seq = self.bert(input_ids, attention_mask, token_type_ids, position_ids, cu_seqlens)  # (B, T, H)
        batch = {
            "masked_positions": masked_positions,
            "masked_labels": masked_labels,
            "nsp_positions": nsp_positions,
            "nsp_labels": nsp_labels,
            "labels": labels,
            "start_positions": start_positions,
            "end_positions": end_positions,
            "attention_mask": attention_mask,  # ModernBERT's mean pooling
        }
        # the encoder's pieces a head shares: they keep their one name here and are passed, not registered twice
        shared = {
            "decoder_weight": cast(nn.Embedding, self.bert.embeddings.tokens).weight,  # (V, H), the tied decoder
            "pooler": self.bert.pooler,
        }
        out = self.head(seq, batch, **{k: shared[k] for k in TASK_HEADS[self.task].inputs})
        out.last_hidden_state = seq
        return out


def build_model(config: BertConfig, task: str, num_labels: int = 2, attention: str = "auto") -> BertForTask:
    """A freshly initialised model for `task` (a key of `TASK_HEADS`); see `BertForTask.forward` for inputs.
    Activation checkpointing, compile, precision and DDP are applied to it from outside (DESIGN §2)."""
    return BertForTask(config, task, num_labels, attention)
