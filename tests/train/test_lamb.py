"""LAMB fast path (foreach) == the plain reference loop of DESIGN §3.4, and parameter groups by name."""

import copy

import pytest
import torch
from torch import nn

from bertforge.optim.lamb import Lamb, param_groups, reference_lamb_step


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(7, 5)
        self.LayerNorm = nn.LayerNorm(5)
        self.out = nn.Linear(5, 3, bias=False)
        self.zero = nn.Parameter(torch.zeros(4))  # a zero weight: trust ratio falls back to 1

    def forward(self, x):
        return self.out(self.LayerNorm(self.dense(x))).sum(-1) + self.zero.sum()


def test_param_groups_by_name():
    groups = param_groups(Toy(), weight_decay=0.01)
    by_wd = {g["weight_decay"]: g["names"] for g in groups}
    assert by_wd[0.01] == ["zero", "dense.weight", "out.weight"]
    assert by_wd[0.0] == ["dense.bias", "LayerNorm.weight", "LayerNorm.bias"]


def test_param_groups_tied_once():
    m = nn.Module()
    m.a = nn.Linear(3, 3)
    m.b = nn.Linear(3, 3)
    m.b.weight = m.a.weight
    groups = param_groups(m, 0.01)
    assert sum(len(g["params"]) for g in groups) == 3


@pytest.mark.parametrize("max_grad_norm", [0.0, 1.0, 0.05])
@pytest.mark.parametrize("seed", [0, 1])
def test_lamb_matches_reference(max_grad_norm, seed):
    torch.manual_seed(seed)
    model = Toy().double()
    ref = copy.deepcopy(model)
    opts = dict(lr=5e-3, betas=(0.9, 0.999), eps=1e-6, max_grad_norm=max_grad_norm)
    groups = param_groups(model, 0.01)
    opt = Lamb(groups, **opts)
    ref_groups = param_groups(ref, 0.01)
    ref_opts = [dict(opts, weight_decay=g["weight_decay"]) for g in ref_groups]
    state: dict = {}
    gen = torch.Generator().manual_seed(seed)
    for step in range(40):
        x = torch.randn(16, 7, generator=gen, dtype=torch.float64) * (1 + step % 5)
        y = torch.randn(16, generator=gen, dtype=torch.float64)
        for m in (model, ref):
            m.zero_grad()
            ((m(x) - y) ** 2).mean().backward()
        opt.step()
        reference_lamb_step([g["params"] for g in ref_groups], ref_opts, state)
    for (n, a), (_, b) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=n)
    assert all(g["step"] == 40 for g in opt.param_groups)
    # the parameters actually moved, and the zero-weight parameter stayed finite
    assert not torch.equal(model.dense.weight, Toy().double().dense.weight)
    assert torch.isfinite(model.zero).all()


def test_clipping_uses_the_global_norm():
    """With clipping, the Adam direction is unchanged by a scale of the gradient, but the moments are: the
    first update after clipping equals the reference that clips by the norm over *both* groups."""
    torch.manual_seed(3)
    model = Toy().double()
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 100
    g = model.dense.weight.grad.clone()
    norm = torch.sqrt(sum((p.grad**2).sum() for p in model.parameters()))
    opt = Lamb(param_groups(model, 0.01), lr=1e-3, max_grad_norm=1.0)
    opt.step()
    m = opt.state[model.dense.weight]["exp_avg"]
    torch.testing.assert_close(m, 0.1 * g / norm)


def test_state_dict_roundtrip():
    torch.manual_seed(0)
    a = Toy()
    b = copy.deepcopy(a)
    oa = Lamb(param_groups(a, 0.01), lr=1e-2)
    for _ in range(3):
        a.zero_grad()
        a(torch.randn(4, 7)).sum().backward()
        oa.step()
    b.load_state_dict(a.state_dict())
    ob = Lamb(param_groups(b, 0.01), lr=1e-2)
    ob.load_state_dict(copy.deepcopy(oa.state_dict()))  # as from a file: no shared tensors
    x = torch.randn(4, 7)
    for m, o in ((a, oa), (b, ob)):
        m.zero_grad()
        m(x).sum().backward()
        o.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    assert ob.param_groups[0]["step"] == 4


def test_compiled_update_tracks_the_foreach_one_and_compiles_once():
    """`Lamb(compile=True)` (optim.compile) against the eager foreach path: 12 steps with a changing lr and the
    global clip, fp32; one graph per group (decay, no-decay) for the whole run, none compiled after step 1."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    eager_model = Toy()
    compiled_model = copy.deepcopy(eager_model)
    eager = Lamb(param_groups(eager_model, 0.01), lr=1e-2, max_grad_norm=1.0)
    compiled = Lamb(param_groups(compiled_model, 0.01), lr=1e-2, max_grad_norm=1.0, compile=True)
    gen = torch.Generator().manual_seed(0)
    torch._dynamo.reset()
    counters.clear()
    graphs = []
    for step in range(12):
        x = torch.randn(16, 7, generator=gen) * (1 + step % 3)
        for model, opt in ((eager_model, eager), (compiled_model, compiled)):
            model.zero_grad()
            model(x).pow(2).mean().backward()
            for g in opt.param_groups:
                g["lr"] = 1e-2 * (1 - step / 12)  # the schedule moves the lr every step
            opt.step()
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs == [2] * 12
    pairs = list(zip(eager_model.named_parameters(), compiled_model.parameters()))
    for (name, a), b in pairs:
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
        torch.testing.assert_close(compiled.state[b]["exp_avg_sq"], eager.state[a]["exp_avg_sq"], msg=name)
    assert not torch.equal(compiled_model.dense.weight, Toy().dense.weight)


def test_optim_compile_is_lamb_only():
    from bertforge.config import ConfigError, OptimConfig

    OptimConfig(name="lamb", compile=True).validate()
    with pytest.raises(ConfigError, match="optim.compile compiles LAMB"):
        OptimConfig(name="adamw", compile=True).validate()


def test_adamw_is_torchs_fused_kernel_on_cpu_and_cuda():
    from bertforge.optim.lamb import build_optimizer

    for device_type, fused in (("cpu", True), ("cuda", True), ("mps", None)):
        opt = build_optimizer(Toy(), "adamw", 1e-3, 0.01, (0.9, 0.999), 1e-6, device_type)
        assert opt.defaults["fused"] is fused and opt.defaults["foreach"] is (None if fused else True)
