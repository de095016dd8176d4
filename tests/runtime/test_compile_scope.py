"""train.compile_scope=layers (regional compilation, `runtime.step.compile_model`): each encoder layer compiled in
place, one graph serving every layer of a kind; the same loss and gradients as eager, parameter names and
state dict unchanged, activation checkpointing left working."""

from __future__ import annotations

import copy

import pytest
import torch
from tests.model.test_model import V, tiny
from torch._dynamo.utils import counters

from bertforge.config import ConfigError, TrainConfig
from bertforge.model import BertConfig, build_model
from bertforge.runtime.activation import apply_activation_checkpointing
from bertforge.runtime.step import compile_model


def config(layers: int = 4) -> BertConfig:
    return tiny(num_hidden_layers=layers)  # no dropout: compiled and eager see the same masks


def batch(mlm_only: bool = False):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, V, (2, 12), generator=g)
    mask = torch.tensor([[1] * 12, [1] * 9 + [0] * 3])
    out = dict(
        input_ids=ids,
        attention_mask=mask,
        masked_positions=torch.tensor([[1, 2], [3, 0]]),
        masked_labels=torch.tensor([[7, 8], [9, 0]]),
    )
    return out if mlm_only else {**out, "nsp_labels": torch.tensor([0, 1])}


def loss_and_grads(runner, model, mlm_only: bool = False):
    model.zero_grad()
    loss = runner(**batch(mlm_only)).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def check_layers_scope(model, mlm_only: bool = False) -> int:
    """Eager vs compile_scope=layers on a copy of `model`; returns the graphs Dynamo compiled."""
    torch._dynamo.reset()
    counters.clear()
    compiled = copy.deepcopy(model)
    runner = compile_model(compiled, compiled, True, "layers")
    assert runner is compiled  # compiled in place: the step calls the model (or its DDP wrapper) as it is
    want_loss, want = loss_and_grads(model, model, mlm_only)
    got_loss, got = loss_and_grads(runner, compiled, mlm_only)
    torch.testing.assert_close(got_loss, want_loss, atol=1e-5, rtol=1e-5)
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-4, msg=name)
    assert list(compiled.state_dict()) == list(model.state_dict())
    return counters["stats"]["unique_graphs"]


def test_one_graph_serves_all_four_bert_layers_with_eager_losses_and_gradients():
    torch.manual_seed(0)
    assert check_layers_scope(build_model(config(), "pretraining")) == 1


def test_layers_scope_under_activation_checkpointing():
    torch.manual_seed(0)
    model = apply_activation_checkpointing(build_model(config(), "pretraining"))
    assert check_layers_scope(model) >= 1


def test_modernbert_layers_compile_once_per_kind():
    """ModernBERT alternates global and local (banded) attention layers, and its first layer has no attention
    norm: a graph per distinct layer, not per layer."""
    torch.manual_seed(0)
    cfg = BertConfig.from_preset("modernbert-tiny", vocab_size=V, num_hidden_layers=6)
    graphs = check_layers_scope(build_model(cfg, "mlm"), mlm_only=True)
    assert 1 <= graphs <= 3 < cfg.num_hidden_layers


def test_the_model_scope_compiles_the_runner_whole():
    model = build_model(config(layers=2), "pretraining")
    runner = compile_model(model, model, "reduce-overhead", "model")
    assert runner is not model and isinstance(runner, torch.nn.Module)
    with pytest.raises(ValueError, match="compile scope 'blocks'"):
        compile_model(model, model, True, "blocks")
    plain = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="Linear has no encoder layers to compile; use compile scope model"):
        compile_model(plain, plain, True, "layers")


def test_compile_scope_is_checked_with_the_config():
    TrainConfig(compile=True, compile_scope="layers").validate()
    with pytest.raises(ConfigError, match="train.compile_scope must be model or layers, not 'layer'"):
        TrainConfig(compile=True, compile_scope="layer").validate()
    with pytest.raises(ConfigError, match="train.compile_scope=layers says what train.compile compiles"):
        TrainConfig(compile_scope="layers").validate()


def test_cuda_graphs_refuse_the_unpadded_layout():
    """varlen unpads each batch to its own token count: CUDA graphs would record a graph per count."""
    TrainConfig(compile=True, cuda_graphs=True, attention="auto").validate()
    with pytest.raises(ConfigError, match="train.cuda_graphs replays the same shapes every step, and train.attention"):
        TrainConfig(compile=True, cuda_graphs=True, attention="varlen").validate()


def test_autotuned_compile_mode_follows_cuda_graphs_and_needs_the_compiled_step():
    """train.compile_autotune picks inductor's max-autotune modes (CUDA graphs kept or not as train.cuda_graphs
    says), is named in the start-up line, and is refused without train.compile=true (auto could leave it off)."""
    from bertforge.config import OptimConfig, compile_mode, step_kind

    tuned = TrainConfig(compile=True, compile_autotune=True)
    assert compile_mode(tuned) == "max-autotune-no-cudagraphs"
    assert compile_mode(TrainConfig(compile=True, cuda_graphs=True, compile_autotune=True)) == "max-autotune"
    assert compile_mode(TrainConfig(compile=True)) is True
    assert step_kind(tuned, OptimConfig()) == "compiled (model scope, autotuned)"
    with pytest.raises(ConfigError, match="train.compile_autotune .* set train.compile=true"):
        TrainConfig(compile_autotune=True).validate()


def test_autotuned_step_matches_eager():
    """The max-autotune mode without CUDA graphs (what train.compile_autotune runs on the CPU and, with
    train.cuda_graphs off, on a GPU): the same loss and gradients as eager on a one-layer model."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = build_model(config(layers=1), "pretraining")
    compiled = copy.deepcopy(model)
    runner = compile_model(compiled, compiled, "max-autotune-no-cudagraphs", "model")
    want_loss, want = loss_and_grads(model, model)
    got_loss, got = loss_and_grads(runner, compiled)
    torch.testing.assert_close(got_loss, want_loss, atol=1e-5, rtol=1e-5)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-4, msg=name)
