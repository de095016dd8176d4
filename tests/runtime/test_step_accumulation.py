"""Accumulation in a step replayed from CUDA graphs: a backward that writes its gradients into one static buffer
(what a CUDA-graph replay does with its memory pool) must still add every micro-batch's gradient. The buffer is
simulated here on the CPU; tests/train/test_gpu_step.py checks the real CUDA graphs against eager."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from bertforge.runtime.step import TrainStep, train_step


class _PoolMatmul(torch.autograd.Function):
    """x @ w whose backward returns w's gradient in one static buffer, as a fresh tensor on its storage each
    time: autograd installs the first one as `.grad` itself, and the next backward writes over it."""

    pool: torch.Tensor | None = None

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        if _PoolMatmul.pool is None:
            _PoolMatmul.pool = torch.empty_like(w)
        torch.matmul(x.t(), grad, out=_PoolMatmul.pool)
        alias = torch.empty(0, dtype=w.dtype).set_(_PoolMatmul.pool.untyped_storage(), 0, w.shape, w.stride())
        return grad @ w.t(), alias


class PoolModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(6, dtype=torch.float32).reshape(3, 2) / 10)

    def forward(self, x):
        return SimpleNamespace(loss=_PoolMatmul.apply(x, self.w).square().sum())


def updated_weight(graphed: bool, accum: int) -> torch.Tensor:
    _PoolMatmul.pool = None
    model = PoolModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    step = TrainStep.build(model, optimizer, torch.device("cpu"), "fp32", max_grad_norm=0.0)
    step = dataclasses.replace(step, graphed=graphed)
    g = torch.Generator().manual_seed(0)
    batches = [{"x": torch.randn(4, 3, generator=g)} for _ in range(accum)]
    train_step(step, batches, accum)
    return model.w.detach()


def reference_weight(accum: int) -> torch.Tensor:
    w = PoolModel().w.detach().clone().requires_grad_()
    g = torch.Generator().manual_seed(0)
    for _ in range(accum):
        ((torch.randn(4, 3, generator=g) @ w).square().sum() / accum).backward()
    return (w - w.grad).detach()


@pytest.mark.parametrize("accum", [1, 3])
def test_a_graphed_step_adds_every_micro_batchs_gradient(accum):
    torch.testing.assert_close(updated_weight(graphed=True, accum=accum), reference_weight(accum), atol=0, rtol=1e-6)


def test_without_the_copy_the_pool_keeps_only_the_last_micro_batch():
    """What the graphed step guards against, seen on the same stand-in."""
    wrong = updated_weight(graphed=False, accum=3)
    assert not torch.allclose(wrong, reference_weight(3), atol=1e-4)


@pytest.mark.parametrize(
    ("mode", "graphed"),
    [
        (False, False),
        (True, False),
        ("reduce-overhead", True),
        ("max-autotune", True),
        ("max-autotune-no-cudagraphs", False),
    ],
)
def test_the_modes_that_replay_cuda_graphs_are_the_graphed_steps(mode, graphed):
    model = PoolModel()
    step = TrainStep.build(model, torch.optim.SGD(model.parameters(), lr=1.0), torch.device("cpu"), "fp32", 0.0, mode)
    assert step.graphed is graphed
