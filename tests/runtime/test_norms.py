"""Low-precision LayerNorm applied from outside the model (`train.low_precision_layernorm`): the plain LayerNorm
bit for bit outside autocast; under bf16 autocast a 16-bit residual stream, fewer bytes kept for backward, the
same loss and gradients within bf16 rounding, unchanged names, no graph break."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from bertforge.config import TrainConfig
from bertforge.errors import ConfigError
from bertforge.model import BertConfig, build_model
from bertforge.runtime.choices import apply_model_choices
from bertforge.runtime.norms import apply_low_precision_layernorm, is_low_precision

V = 101
H = 128  # the tiny presets' hidden size


def tiny(modern: bool = False) -> BertConfig:
    return BertConfig.from_preset("modernbert-tiny" if modern else "tiny", vocab_size=V, max_position_embeddings=64)


def batch(modern: bool = False, rows: int = 2):
    """`rows` x 48 tokens, 2 masked per row: with many rows the activations outweigh the weights' bf16 copies."""
    g = torch.Generator().manual_seed(1)
    b = dict(
        input_ids=torch.randint(5, V, (rows, 48), generator=g),
        masked_positions=torch.tensor([[1, 2], [3, 0]]).repeat(rows // 2, 1),
        masked_labels=torch.tensor([[7, 8], [9, 0]]).repeat(rows // 2, 1),
    )
    return b if modern else {**b, "nsp_labels": torch.tensor([0, 1]).repeat(rows // 2)}


def pair(modern: bool = False):
    torch.manual_seed(0)
    plain = build_model(tiny(modern), "mlm" if modern else "pretraining").train()
    low = copy.deepcopy(plain)
    apply_low_precision_layernorm(low)
    return plain, low


def run(model, autocast: bool, modern: bool = False, saved: list | None = None, rows: int = 2):
    """loss, gradients, and the dtype of every LayerNorm's output, one forward + backward with dropout seeded."""
    model.zero_grad()
    dtypes: list[torch.dtype] = []
    hooks = [
        m.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
        for m in model.modules()
        if isinstance(m, nn.LayerNorm)
    ]
    torch.manual_seed(3)
    keep = saved if saved is not None else []
    hook = torch.autograd.graph.saved_tensors_hooks(lambda t: keep.append(t) or t, lambda t: t)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), hook:
        loss = model(**batch(modern, rows)).loss
    loss.float().backward()
    for h in hooks:
        h.remove()
    return loss.detach().float(), {n: p.grad.clone() for n, p in model.named_parameters()}, dtypes


def hidden_bytes(saved: list[torch.Tensor]) -> dict[torch.dtype, int]:
    """Bytes of the hidden-state-shaped tensors ((B, T, H) or (B*T, H)) that autograd kept, by dtype."""
    out: dict[torch.dtype, int] = {}
    for t in saved:
        if t.dim() and t.shape[-1] == H and t.numel() >= 32 * 48 * H:
            out[t.dtype] = out.get(t.dtype, 0) + t.numel() * t.element_size()
    return out


@pytest.mark.parametrize("modern", [False, True])
def test_outside_autocast_it_is_the_plain_layernorm_bit_for_bit(modern):
    plain, low = pair(modern)
    loss_p, grads_p, dt_p = run(plain, autocast=False, modern=modern)
    loss_l, grads_l, dt_l = run(low, autocast=False, modern=modern)
    torch.testing.assert_close(loss_l, loss_p, atol=0, rtol=0)
    for name, g in grads_p.items():
        torch.testing.assert_close(grads_l[name], g, atol=0, rtol=0, msg=name)
    assert set(dt_l) == set(dt_p) == {torch.float32}


@pytest.mark.parametrize("modern", [False, True])
def test_under_bf16_autocast_the_norms_and_residual_stream_are_16_bit_with_the_same_loss(modern):
    plain, low = pair(modern)
    saved_p: list[torch.Tensor] = []
    saved_l: list[torch.Tensor] = []
    loss_p, grads_p, dt_p = run(plain, autocast=True, modern=modern, saved=saved_p, rows=32)
    loss_l, grads_l, dt_l = run(low, autocast=True, modern=modern, saved=saved_l, rows=32)
    assert torch.float32 in dt_p  # the reason for it: autocast's LayerNorm hands fp32 to the residual stream
    assert set(dt_l) == {torch.bfloat16}
    torch.testing.assert_close(loss_l, loss_p, atol=0, rtol=2e-2)
    for name, g in grads_p.items():  # bf16 rounding apart, the same gradients (direction and size)
        cos = torch.nn.functional.cosine_similarity(grads_l[name].flatten(), g.flatten(), dim=0)
        assert cos > 0.98, (name, cos)
    hidden_p, hidden_l = hidden_bytes(saved_p), hidden_bytes(saved_l)  # {dtype: bytes} kept for backward
    assert hidden_p.get(torch.float32, 0) > 0 and hidden_l.get(torch.float32, 0) == 0, (hidden_p, hidden_l)
    assert sum(hidden_l.values()) < 0.7 * sum(hidden_p.values()), (hidden_l, hidden_p)  # the traffic it saves


def test_names_state_dict_and_idempotence():
    plain, low = pair()
    assert list(low.state_dict()) == list(plain.state_dict())
    n = apply_low_precision_layernorm(low)  # twice: the same as once
    assert n == sum(isinstance(m, nn.LayerNorm) for m in low.modules()) == 2 * 2 + 1 + 1  # layers, embeddings, head
    assert all(is_low_precision(m) for m in low.modules() if isinstance(m, nn.LayerNorm))
    low.load_state_dict(plain.state_dict())  # a checkpoint loads either way
    with pytest.raises(ValueError, match="no nn.LayerNorm"):
        apply_low_precision_layernorm(nn.Sequential(nn.Linear(2, 2)))


def test_traces_without_a_graph_break_under_autocast():
    _, low = pair()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        explained = torch._dynamo.explain(low)(**batch())
    assert explained.graph_break_count == 0, explained.break_reasons


def test_the_setting_is_applied_from_the_train_section_and_refused_in_fp32():
    torch.manual_seed(0)
    model = build_model(tiny(), "pretraining")
    apply_model_choices(model, TrainConfig(low_precision_layernorm=True))
    assert all(is_low_precision(m) for m in model.modules() if isinstance(m, nn.LayerNorm))
    untouched = apply_model_choices(build_model(tiny(), "pretraining"), TrainConfig())
    assert not any(is_low_precision(m) for m in untouched.modules())
    with pytest.raises(ConfigError, match="train.low_precision_layernorm"):
        TrainConfig(low_precision_layernorm=True, precision="fp32").validate()
