"""Edge cases of every attention path against the reference: eager attention on each sequence alone, unpadded.

The batches hold a row with trailing padding, a row of padding only, a packed row whose last sequence ends
exactly at the row's end, and a row of many short sequences (length 1 included); ModernBERT adds its sliding
window over packed rows, dense and blocked (`BandMask`). Outputs at every real token and the gradients of a
loss that reads every real token must equal the reference's, on every kernel and layout: padded (`eager`,
`sdpa`, `auto`), unpadded (`varlen`), and the CUDA flash paths (unpadded and segmented) run on the CPU with the
traceable reference kernel of tests/conftest.py standing in for the flash kernel.
"""

from __future__ import annotations

import pytest
import torch

from bertforge.model import BertConfig, build_model
from bertforge.model import attention as attn

V, T = 97, 16
ROWS = [[5, 4, 3], [], [9, 7], [2, 2, 1, 1, 3, 1, 2, 1, 1, 2]]  # trailing padding, empty, exact end, many short


def config(modern: bool, local_attention: int = 6) -> BertConfig:
    if modern:
        base = BertConfig.from_preset("modernbert-tiny", vocab_size=V, local_attention=local_attention).to_dict()
        return BertConfig(**{**base, "hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 48})
    return BertConfig(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=T,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def packed_batch(rows=ROWS, length=T, seed=1):
    """Packed rows (sequence index mask, positions restarting at 0, token types per sequence) and where each
    sequence sits: [(row, offset, ids, token types)]."""
    g = torch.Generator().manual_seed(seed)
    batch = {k: torch.zeros(len(rows), length, dtype=torch.long) for k in ("input_ids", "attention_mask")}
    batch.update(token_type_ids=torch.zeros_like(batch["input_ids"]), position_ids=torch.zeros_like(batch["input_ids"]))
    seqs = []
    for r, lengths in enumerate(rows):
        off = 0
        for k, n in enumerate(lengths):
            ids, types = torch.randint(3, V, (n,), generator=g), (torch.arange(n) >= n // 2).long()
            batch["input_ids"][r, off : off + n], batch["attention_mask"][r, off : off + n] = ids, k + 1
            batch["token_type_ids"][r, off : off + n], batch["position_ids"][r, off : off + n] = types, torch.arange(n)
            seqs.append((r, off, ids, types))
            off += n
    return batch, seqs


def loss_of(hidden: torch.Tensor) -> torch.Tensor:
    """A loss every hidden unit reaches (a sum of squares after a LayerNorm would be nearly constant)."""
    w = torch.linspace(-1, 1, hidden.shape[-1])
    return (hidden @ w).sin().sum()


def check_against_each_sequence_alone(model, batch, seqs, **extra):
    reference = build_model(model.config, "mlm", attention="eager").eval()
    reference.load_state_dict(model.state_dict())
    hidden = model(**batch, **extra).last_hidden_state
    assert torch.isfinite(hidden).all()
    params = list(model.bert.parameters())  # the encoder's: the MLM head is not in this loss
    got = torch.autograd.grad(sum(loss_of(hidden[r, o : o + len(ids)]) for r, o, ids, _ in seqs), params)
    want_loss = 0
    for r, o, ids, types in seqs:
        alone = reference(ids[None], torch.ones(1, len(ids), dtype=torch.long), types[None]).last_hidden_state[0]
        torch.testing.assert_close(hidden[r, o : o + len(ids)], alone, atol=1e-5, rtol=0)
        want_loss = want_loss + loss_of(alone)
    want = torch.autograd.grad(want_loss, list(reference.bert.parameters()))
    for (name, _), a, b in zip(model.bert.named_parameters(), got, want):
        # fp32 sums over many tokens (a position row's gradient reaches ~70): tolerance relative to the largest
        torch.testing.assert_close(a, b, atol=1e-6 * max(10.0, b.abs().max().item()), rtol=1e-4, msg=name)


@pytest.mark.parametrize("modern,local_attention", [(False, 6), (True, 6), (True, 12)])
@pytest.mark.parametrize("impl", ["eager", "sdpa", "auto", "varlen"])
def test_every_masked_path_equals_each_sequence_alone(modern, local_attention, impl):
    """ModernBERT window 6 (half 3): rows of 16 attend in blocks; window 12 (half 6): the dense window mask."""
    torch.manual_seed(0)
    model = build_model(config(modern, local_attention), "mlm", attention=impl).eval()
    if modern:
        kind = attn.BandMask if local_attention == 6 else torch.Tensor
        assert isinstance(model.bert._masks(torch.ones(1, T))["sliding_attention"], kind)
    check_against_each_sequence_alone(model, *packed_batch())


@pytest.mark.parametrize("modern", [False, True])
@pytest.mark.parametrize("segmented", [False, True])
def test_flash_layouts_equal_each_sequence_alone(flash_stand_in, modern, segmented):
    """The flash kernel's inputs for the same batch: unpadded (cu_seqlens over the real tokens) or segmented
    (every token, padding runs and the empty row as their own segments)."""
    torch.manual_seed(0)
    model = build_model(config(modern), "mlm", attention="auto").eval()
    batch, seqs = packed_batch()
    extra = {"cu_seqlens": attn.segment_bounds(batch["attention_mask"])} if segmented else {}
    check_against_each_sequence_alone(model, batch, seqs, **extra)
    cu, indices, _ = flash_stand_in[-1]
    assert (indices is None) == segmented
    lengths = [n for lengths in ROWS for n in lengths]
    if not segmented:  # one segment per sequence, none for the empty row
        assert cu.dtype == torch.int32 and torch.diff(cu).tolist() == lengths
    else:  # runs: 3 sequences + padding, the padding row, 2 sequences, 10 sequences + padding; to a multiple of 4
        assert cu.tolist()[:18] == [0, 5, 9, 12, 16, 32, 41, 48, 50, 52, 53, 54, 57, 58, 60, 61, 62, 64]
        assert len(cu) == 4 * 5 + 1 and cu.tolist()[18:] == [64] * 3
    # ModernBERT-tiny: global, local, local, global; the window's half to the kernel, inclusive bounds
    assert [w for _, _, w in flash_stand_in] == ([None, 3, 3, None] if modern else [None, None])


def test_varlen_meta_edges():
    """cu_seqlens and max_seqlen with a padding-only row, length-1 sequences and a sequence ending the row."""
    mask = torch.tensor([[1, 2, 3, 3, 0, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 1, 1]])
    meta = attn.varlen_meta(mask)
    assert meta.cu_seqlens.tolist() == [0, 1, 2, 4, 7, 10, 16] and meta.max_seqlen == 6
    assert meta.indices.tolist() == [0, 1, 2, 3, *range(12, 24)]
    empty = attn.varlen_meta(torch.zeros(2, 3, dtype=torch.long))
    assert empty.indices.numel() == 0 and empty.cu_seqlens.tolist() == [0] and empty.max_seqlen == 0


def test_masks_never_leave_a_softmax_row_empty():
    """No query, real or padding, in any layout, is left without a key: an all -inf softmax row gives NaN."""
    mask = torch.tensor([[1, 2, 2, 0, 0, 0, 0, 0, 0, 0], [0] * 10, [1] * 10])
    assert attn.block_mask(mask).any(-1).all()
    for half in (1, 2, 3):
        assert attn.block_mask(mask, half).any(-1).all()
        assert attn.band_mask(mask, half).mask.any(-1).all()


@pytest.mark.parametrize("modern", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_stays_finite_on_padding_only_rows(modern, dtype):
    """Boolean masks, no additive large negative: a padding-only row gives no NaN in 16-bit, forward or
    backward, under autocast and on a model cast down, training (unfused attention with dropout) or not."""
    cfg = config(modern)
    cfg.attention_probs_dropout_prob = 0.1
    batch, _ = packed_batch()
    for impl in ("eager", "sdpa", "auto", "varlen"):
        for cast in (False, True):
            torch.manual_seed(0)
            model = build_model(cfg, "mlm", attention=impl).train()
            with torch.autocast("cpu", dtype=dtype, enabled=not cast):
                hidden = model.to(dtype if cast else torch.float32)(**batch).last_hidden_state
            hidden.float().sum().backward()
            assert torch.isfinite(hidden).all(), (impl, cast)
            assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None), (impl, cast)


@pytest.mark.parametrize("fn", [attn.eager, attn.sdpa, attn.unfused])
def test_attention_dropout_is_unbiased_on_packed_rows(fn):
    """Dropout on the probabilities of a block-diagonal mask, scaled by 1/(1-p): the mean over draws is the
    output without dropout (each sequence's own keys only; nothing leaks across sequences)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 4, dtype=torch.float64) for _ in range(3))
    mask = attn.block_mask(torch.tensor([[1] * 5 + [2] + [3] * 4 + [0] * 2]))
    want = attn.eager(q, k, v, mask, 0.0)
    q, k, v, mask = (x.expand(2000, *x.shape[1:]) for x in (q, k, v, mask))
    mean = fn(q, k, v, mask, 0.3).mean(0, keepdim=True)
    assert ((mean - want).abs().max() / want.abs().max()).item() < 0.05


def test_dropout_rate_reaches_the_flash_kernel_only_in_training(monkeypatch):
    """The flash paths pass the attention dropout rate to the kernel while training and 0 in eval."""
    seen = []

    def kernel(q, k, v, meta, dropout_p, half_window=None):
        seen.append(dropout_p)
        return attn.sdpa(*(x.transpose(0, 1)[None] for x in (q, k, v)), torch.ones(1, 1, 1, 1, dtype=torch.bool), 0.0)[
            0
        ].transpose(0, 1)

    monkeypatch.setattr(attn, "varlen_usable", lambda h, d: True)
    monkeypatch.setattr(attn, "varlen", kernel)
    cfg = config(False)
    cfg.attention_probs_dropout_prob = 0.25
    model = build_model(cfg, "mlm", attention="auto")
    ids = torch.randint(3, V, (2, 8))
    for train, want in ((True, 0.25), (False, 0.0)):
        seen.clear()
        model.train(train)(ids, cu_seqlens=attn.segment_bounds(torch.ones(2, 8)))
        model(ids)
        assert seen == [want] * 4


def test_auto_picks_sdpa_or_unfused_off_cuda():
    x = torch.randn(2, 4, 8, 16)
    assert not attn.varlen_usable(x, 16)  # CPU: never the flash kernel
    assert attn.masked_kernel("auto", 0.0, x) is attn.sdpa
    assert attn.masked_kernel("auto", 0.1, x) is attn.unfused
    assert attn.masked_kernel("sdpa", 0.1, x) is attn.sdpa
    assert attn.masked_kernel("varlen", 0.1, x) is attn.sdpa
    assert attn.masked_kernel("eager", 0.0, x) is attn.eager


def test_mlm_head_with_no_masked_slot_and_slots_on_padding():
    """0 masked tokens: loss 0 with zero gradients, not NaN, eval and training (compacted) alike; a slot at a
    padding position is scored like any other slot (the data decides what a slot points at)."""
    torch.manual_seed(0)
    model = build_model(config(False), "mlm", attention="varlen")
    batch, _ = packed_batch()
    none = torch.zeros(4, 3, dtype=torch.long)
    for train in (True, False):
        out = model.train(train)(**batch, masked_positions=none, masked_labels=none)
        grads = torch.autograd.grad(out.loss, [p for p in model.parameters() if p.requires_grad], allow_unused=True)
        assert out.loss.item() == 0.0 and int(out.mlm_count) == 0
        assert all(g is None or (g == 0).all() for g in grads)
    at_padding = torch.tensor([[13, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]])  # row 0 is real up to 12
    out = model.eval()(**batch, masked_positions=at_padding, masked_labels=at_padding.clamp(max=5))
    assert int(out.mlm_count) == 1 and torch.isfinite(out.loss)


@pytest.mark.parametrize("impl", ["sdpa", "varlen"])
def test_modernbert_mean_pooling_reads_only_real_tokens(impl):
    """Mean pooling over the real tokens: a padded row's logits equal the same sequence's alone, whatever the
    padding positions hold (real outputs on the padded path, zeros on the unpadded one)."""
    cfg = config(True)
    cfg.classifier_pooling = "mean"
    torch.manual_seed(0)
    model = build_model(cfg, "classification", num_labels=3, attention=impl).eval()
    ids = torch.randint(3, V, (2, 10))
    mask = (torch.arange(10)[None] < torch.tensor([10, 4])[:, None]).long()
    with torch.no_grad():
        both = model(ids, mask).logits
        alone = model(ids[1:, :4], torch.ones(1, 4, dtype=torch.long)).logits
    torch.testing.assert_close(both[1:], alone, atol=1e-5, rtol=0)
