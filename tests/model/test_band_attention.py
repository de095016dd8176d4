"""Blocked sliding-window attention (`BandMask`): the local layers of long rows attend in blocks of half a
window against three key blocks instead of through a (T, T) mask. It must allow exactly what the dense mask
allows (same outputs at every position, padding included, and the same gradients), and its memory must grow
linearly with the row length where the dense mask's grows with its square."""

from __future__ import annotations

import pytest
import torch

from bertforge.model import BertConfig, build_model
from bertforge.model import attention as attn
from bertforge.model.bert import PreNormLayer

NH, D = 2, 8


def masks(T: int) -> torch.Tensor:
    """(4, T): a full row, a padded one, two packed sequences then padding, and a row of padding only."""
    m = torch.ones(4, T, dtype=torch.long)
    m[1, T - 5 :] = 0
    m[2, T // 3 : 2 * T // 3] = 2
    m[2, 2 * T // 3 :] = 0
    m[3] = 0
    return m


@pytest.mark.parametrize("T,half", [(13, 4), (29, 4), (64, 8), (100, 16), (301, 64)])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_band_equals_the_dense_window_mask_everywhere(T, half, impl):
    am = masks(T)
    torch.manual_seed(T)
    qkv = torch.randn(4, T, 3 * NH * D, requires_grad=True)
    weight = torch.randn(4, T, NH * D)  # a loss that reads every position, padding included
    outs, grads = [], []
    for mask in (attn.block_mask(am, half), attn.band_mask(am, half)):
        out = attn.attend(qkv, NH, mask, None, 0.0, impl)  # (4, T, NH*D)
        outs.append(out)
        grads.append(torch.autograd.grad((out * weight).sum(), qkv)[0])
    assert torch.isfinite(outs[1]).all()
    torch.testing.assert_close(outs[1], outs[0], atol=2e-6, rtol=0)
    torch.testing.assert_close(grads[1], grads[0], atol=5e-6, rtol=0)


def test_the_model_picks_blocks_only_where_they_pay():
    config = BertConfig.from_preset("modernbert-tiny", vocab_size=64)  # window 128: half 64
    model = build_model(config, "mlm").bert
    short, long = torch.ones(1, 3 * 64, dtype=torch.long), torch.ones(1, 3 * 64 + 1, dtype=torch.long)
    assert isinstance(model._masks(short)["sliding_attention"], torch.Tensor)
    assert isinstance(model._masks(long)["sliding_attention"], attn.BandMask)
    assert isinstance(model._masks(long)["full_attention"], torch.Tensor)


def test_model_outputs_equal_with_and_without_blocks(monkeypatch):
    """The whole ModernBERT encoder, training-mode forward and backward, on rows long enough for blocks."""
    config = BertConfig.from_preset("modernbert-tiny", vocab_size=64, local_attention=16)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    torch.manual_seed(0)
    model = build_model(config, "mlm")
    ids, am = torch.randint(5, 64, (4, 80)), masks(80)
    runs = []
    for usable in (True, False):
        monkeypatch.setattr(attn, "band_usable", lambda T, half, usable=usable: usable and half is not None)
        model.zero_grad()
        h = model.bert(ids, am)  # (4, 80, 128)
        (h * h).sum().backward()
        runs.append((h.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(runs[0][0], runs[1][0], atol=1e-5, rtol=0)
    for a, b in zip(runs[0][1], runs[1][1]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def saved_bytes(layer: torch.nn.Module, T: int, dense: bool) -> int:
    """Bytes a local layer's forward keeps for its backward (the activation memory of training), with its
    mask: each storage counted once."""
    am = torch.ones(1, T, dtype=torch.long)
    mask = attn.block_mask(am, 64) if dense else attn.band_mask(am, 64)
    storages: dict[int, int] = {}

    def pack(x):
        storages[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        return x

    h = torch.randn(1, T, 128, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        layer(h, mask)
    held = mask if dense else mask.mask
    storages[held.untyped_storage().data_ptr()] = held.untyped_storage().nbytes()
    return sum(storages.values())


def test_local_layer_memory_grows_linearly_with_length():
    config = BertConfig.from_preset("modernbert-tiny", vocab_size=64)  # window 128
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    layer = PreNormLayer(config, "auto", index=1)  # a local layer
    assert layer.attn.half_window == 64
    band = [saved_bytes(layer, T, dense=False) for T in (1024, 2048, 4096)]
    dense = [saved_bytes(layer, T, dense=True) for T in (1024, 2048, 4096)]
    for a, b in zip(band, band[1:]):
        assert 1.9 < b / a < 2.1, band  # linear: twice the length, twice the memory
    assert dense[2] / dense[1] > 3.0, dense  # the (T, T) mask: on its way to 4x per doubling
    assert band[2] < dense[2] / 2


def test_blocked_encoder_compiles_without_graph_breaks():
    torch._dynamo.reset()
    config = BertConfig.from_preset("modernbert-tiny", vocab_size=64, local_attention=16)
    model = build_model(config, "mlm")
    ids, am = torch.randint(5, 64, (2, 80)), masks(80)[1:3]
    explain = torch._dynamo.explain(model.bert)(ids, am)
    assert explain.graph_break_count == 0, explain.break_reasons
