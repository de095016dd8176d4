"""Audit of mixed precision in the training step on the CPU: the global-norm clip on devices without torch's
multi-tensor kernels (MPS, HPU), fp16 loss scaling with a skipped update through the compiled LAMB and the eager
one, and the loss scaler's state carried across a resume bit for bit."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.utils.clip_grad as clip_grad
from torch import nn

from bertforge.optim.lamb import Lamb, param_groups
from bertforge.runtime.step import TrainStep, train_step

CPU = torch.device("cpu")


class Toy(nn.Module):
    """Decay and no-decay parameters; a squared-output loss whose gradient norm exceeds 1 (the clip acts)."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(6, 5)
        self.LayerNorm = nn.LayerNorm(5)
        self.out = nn.Linear(5, 3)

    def forward(self, x):
        return SimpleNamespace(loss=self.out(self.LayerNorm(self.dense(x))).square().mean())


def _updates(n: int, poison: int | None = None) -> list[list[dict[str, torch.Tensor]]]:
    """n updates of two micro-batches each; update `poison` has an inf input (its gradients are not finite)."""
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        x = torch.randn(4, 6, generator=g) * 3
        if i == poison:
            x[0, 0] = math.inf
        out.append([{"x": x}, {"x": x.flip(0) * 0.5}])
    return out


def _scaler(**kw) -> torch.amp.GradScaler:
    return torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2, **kw)


def test_the_step_clips_on_a_device_without_multi_tensor_kernels(monkeypatch):
    """MPS and HPU have no foreach kernels for clip_grad_norm_: foreach=True raised "can't use the foreach API on
    mps tensors" at the first update of every run there. The CPU stands in for them here, the same update."""
    torch.manual_seed(0)
    here, there = Toy(), Toy()
    there.load_state_dict(here.state_dict())
    updates = _updates(1)
    expect = train_step(TrainStep.build(here, torch.optim.SGD(here.parameters(), lr=0.1), CPU, "fp32"), updates[0], 2)
    monkeypatch.setattr(clip_grad, "_device_has_foreach_support", lambda device: device.type != "cpu")
    monkeypatch.setattr(clip_grad, "_has_foreach_support", lambda tensors, device: device.type != "cpu")
    got = train_step(TrainStep.build(there, torch.optim.SGD(there.parameters(), lr=0.1), CPU, "fp32"), updates[0], 2)
    assert got.finite and float(got.grad_norm) > 1.0  # the clip acted
    torch.testing.assert_close(got.grad_norm, expect.grad_norm, rtol=1e-6, atol=0)
    for p, q in zip(here.parameters(), there.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)


def _lamb_run(model: nn.Module, compile: bool, updates) -> tuple[list, dict, dict]:
    opt = Lamb(param_groups(model, 0.01), lr=1e-2, compile=compile)
    scaler = _scaler()
    step = TrainStep.build(model, opt, CPU, "fp16", max_grad_norm=1.0, scaler=scaler)
    results = [train_step(step, u, 2) for u in updates]
    return results, opt.state_dict(), scaler.state_dict()


def test_fp16_updates_through_the_compiled_lamb_match_the_eager_ones_around_a_skipped_step():
    """optim.compile's LAMB against the eager foreach one under fp16 autocast and loss scaling, accumulation 2,
    with an overflowing update in the middle: the same updates, the same skip, the same scale and LAMB steps."""
    torch.manual_seed(0)
    eager_model = Toy()
    compiled_model = copy.deepcopy(eager_model)
    updates = _updates(4, poison=1)
    torch._dynamo.reset()
    eager, eager_opt, eager_scale = _lamb_run(eager_model, False, updates)
    compiled, compiled_opt, compiled_scale = _lamb_run(compiled_model, True, updates)
    assert [r.finite for r in eager] == [r.finite for r in compiled] == [True, False, True, True]
    assert eager_scale == compiled_scale and eager_scale["scale"] == 2.0**10  # halved once, grown back once
    assert [g["step"] for g in compiled_opt["param_groups"]] == [g["step"] for g in eager_opt["param_groups"]] == [3, 3]
    for e, c in zip(eager, compiled):
        if e.finite:
            assert torch.equal(c.loss, e.loss) and torch.equal(c.grad_norm, e.grad_norm)
    for (name, a), b in zip(eager_model.named_parameters(), compiled_model.parameters()):
        assert a.dtype == torch.float32  # fp32 master weights under autocast
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.parametrize("stop", [1, 2])
def test_an_fp16_step_resumed_from_its_saved_states_is_the_uninterrupted_one_bit_for_bit(stop):
    """The scaler's scale and growth tracker, LAMB's moments and step, saved after update `stop` (1: right after
    the overflow, 2: one update into the scale's regrowth) and loaded into fresh objects: the updates that follow
    are the uninterrupted run's exactly, the scale included."""
    torch.manual_seed(0)
    model = Toy()
    start = copy.deepcopy(model.state_dict())
    updates = _updates(5, poison=1)
    full, _, full_scale = _lamb_run(model, False, updates)

    first = Toy()
    first.load_state_dict(start)
    opt = Lamb(param_groups(first, 0.01), lr=1e-2)
    scaler = _scaler()
    step = TrainStep.build(first, opt, CPU, "fp16", scaler=scaler)
    for u in updates[: stop + 1]:
        train_step(step, u, 2)
    saved = copy.deepcopy((first.state_dict(), opt.state_dict(), scaler.state_dict()))

    resumed = Toy()
    resumed.load_state_dict(saved[0])
    opt = Lamb(param_groups(resumed, 0.01), lr=1e-2)
    opt.load_state_dict(saved[1])
    scaler = _scaler()
    scaler.load_state_dict(saved[2])
    step = TrainStep.build(resumed, opt, CPU, "fp16", scaler=scaler)
    rest = [train_step(step, u, 2) for u in updates[stop + 1 :]]
    assert [r.finite for r in rest] == [r.finite for r in full[stop + 1 :]]
    assert [r.loss.item() for r in rest] == [r.loss.item() for r in full[stop + 1 :]]
    assert scaler.state_dict() == full_scale
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
