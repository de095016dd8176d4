"""Model FLOPs per sequence, the numerator of MFU (Chowdhery et al. 2022, PaLM appendix B: matmul FLOPs only).

A matmul of (m, k) x (k, n) costs 2mkn. For one sequence of T tokens, hidden H, intermediate I, L layers:

    per layer   QKV 2T·H·3H + scores 2T·T·H + context 2T·T·H + attention out 2T·H·H + FFN 2·2T·H·I
    MLM head    P·(2H·H + 2H·V)       only the P masked slots, as our masked-only head computes it
    NSP head    2H·H (pooler) + 2H·2
    QA          2T·H·2;  classification 2H·H + 2H·labels;  token classification 2T·H·labels

ModernBERT: the GeGLU feed-forward is three I x H matmuls (2T·H·2I in, 2T·I·H out: 6T·H·I), and a local layer's
scores and context see at most local_attention + 1 keys per query instead of T. Its QA and token-classification
heads run the prediction head's dense H x H on every token first (2T·H·H more; BERT's have none).

Embedding lookups, LayerNorm, softmax and activations are not matmuls and are left out (a few percent).
Training counts 3x forward (backward is two matmuls per forward matmul). Because the Hugging Face baseline
computes the MLM head densely, MFU computed with this formula credits only useful work: a model that spends
FLOPs on the T - P unmasked positions gets a lower MFU, not a higher one.
"""

from __future__ import annotations

from bertforge.model.config import BertConfig


def encoder_flops(config: BertConfig, seq_len: float) -> float:
    T, H, I = seq_len, config.hidden_size, config.intermediate_size
    ffn = (6 if config.modern else 4) * T * H * I
    total = 0.0
    for kind in config.layer_types:
        keys = min(T, config.local_attention + 1) if kind == "sliding_attention" else T
        total += 2 * T * H * 3 * H + 2 * 2 * T * keys * H + 2 * T * H * H + ffn
    return float(total)


def head_flops(config: BertConfig, seq_len: float, masked_per_seq: float, task: str, num_labels: int = 2) -> float:
    H, V, T = config.hidden_size, config.vocab_size, seq_len
    mlm = masked_per_seq * (2 * H * H + 2 * H * V)
    nsp = 2 * H * H + 2 * H * 2
    per_token = 2 * T * H * H if config.modern else 0  # ModernBERT's `head` before the per-token classifier
    table = {
        "pretraining": mlm + nsp,
        "mlm": mlm,
        "qa": per_token + 2 * T * H * 2,
        "classification": 2 * H * H + 2 * H * num_labels,  # BERT's pooler, or ModernBERT's head on the pooled
        "regression": 2 * H * H + 2 * H,
        "token_classification": per_token + 2 * T * H * num_labels,
    }
    if task not in table:
        raise ValueError(f"unknown task {task!r}; one of {', '.join(table)}")
    return float(table[task])


def flops_per_sequence(
    config: BertConfig,
    seq_len: float,
    masked_per_seq: float = 0,
    task: str = "pretraining",
    training: bool = True,
    num_labels: int = 2,
) -> float:
    """Matmul FLOPs for one sequence of `seq_len` tokens (training: forward + backward = 3x forward)."""
    fwd = encoder_flops(config, seq_len) + head_flops(config, seq_len, masked_per_seq, task, num_labels)
    return 3.0 * fwd if training else fwd
