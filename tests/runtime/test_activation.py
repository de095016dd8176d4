"""Activation checkpointing applied from outside the model: same loss and gradients, fewer saved
activations, unchanged parameter names and checkpoints."""

from __future__ import annotations

import copy

import pytest
import torch

from bertforge.model import BertConfig, build_model
from bertforge.runtime.activation import apply_activation_checkpointing, is_checkpointed

V = 101


def tiny(layers: int = 2) -> BertConfig:
    # dropout on: the recomputation must replay the forward's masks
    return BertConfig(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )


def batch():
    g = torch.Generator().manual_seed(1)
    return dict(
        input_ids=torch.randint(5, V, (2, 10), generator=g),
        masked_positions=torch.tensor([[1, 2], [3, 0]]),
        masked_labels=torch.tensor([[7, 8], [9, 0]]),
        nsp_labels=torch.tensor([0, 1]),
    )


def loss_and_grads(model, saved: list | None = None):
    model.zero_grad()
    torch.manual_seed(3)
    if saved is None:
        loss = model(**batch()).loss
    else:  # count the tensors autograd keeps for backward
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            loss = model(**batch()).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_same_loss_and_gradients_and_fewer_saved_activations():
    torch.manual_seed(0)
    plain = build_model(tiny(layers=4), "pretraining").train()
    ckpt = apply_activation_checkpointing(copy.deepcopy(plain))
    saved_plain, saved_ckpt = [], []
    loss_p, grads_p = loss_and_grads(plain, saved_plain)
    loss_c, grads_c = loss_and_grads(ckpt, saved_ckpt)
    torch.testing.assert_close(loss_c, loss_p, atol=0, rtol=0)
    assert grads_c.keys() == grads_p.keys()
    for name in grads_p:
        torch.testing.assert_close(grads_c[name], grads_p[name], atol=1e-6, rtol=1e-5, msg=name)
    # only what each layer is called with stays alive (the rest is recomputed): 4 layers saved 26 tensors each
    assert len(saved_plain) - len(saved_ckpt) > 4 * 20, (len(saved_ckpt), len(saved_plain))


def test_names_and_state_dict_unchanged_and_checkpoints_cross_load(tmp_path):
    torch.manual_seed(0)
    plain = build_model(tiny(), "pretraining")
    names = [n for n, _ in plain.named_parameters()]
    keys = list(plain.state_dict())
    ckpt = apply_activation_checkpointing(build_model(tiny(), "pretraining"))
    assert [n for n, _ in ckpt.named_parameters()] == names and list(ckpt.state_dict()) == keys
    assert all(is_checkpointed(layer) for layer in ckpt.bert.encoder.layer)
    # saved with it on, loaded with it off (strict), and the other way: same outputs
    torch.save(ckpt.state_dict(), tmp_path / "on.pt")
    fresh = build_model(tiny(), "pretraining")
    fresh.load_state_dict(torch.load(tmp_path / "on.pt", weights_only=True))
    ckpt.load_state_dict(plain.state_dict())
    for a, b in ((fresh, ckpt), (plain, ckpt)):
        a.load_state_dict(b.state_dict())
        assert torch.equal(loss_and_grads(a.train())[0], loss_and_grads(b.train())[0])


def test_idempotent_eval_unaffected_and_no_layers_is_an_error():
    torch.manual_seed(0)
    model = apply_activation_checkpointing(apply_activation_checkpointing(build_model(tiny(), "qa")))
    layer = model.bert.encoder.layer[0]
    assert is_checkpointed(layer)
    model.eval()
    saved: list = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        model(torch.randint(5, V, (1, 6))).start_logits.sum().backward()
    plain = build_model(tiny(), "qa").eval()
    plain.load_state_dict(model.state_dict())
    saved_plain: list = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved_plain.append(t) or t, lambda t: t):
        plain(torch.randint(5, V, (1, 6))).start_logits.sum().backward()
    assert len(saved) == len(saved_plain)  # not training: a plain forward
    with pytest.raises(ValueError, match="no encoder layers"):
        apply_activation_checkpointing(torch.nn.Linear(2, 2))


def test_traces_without_graph_breaks():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = apply_activation_checkpointing(build_model(tiny(), "pretraining")).train()
    explain = torch._dynamo.explain(model)(**batch())
    assert explain.graph_break_count == 0, explain.break_reasons
