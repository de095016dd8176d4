"""The optimizer, schedule and training step against their references: NVIDIA's LAMB in the form of apex's
FusedLAMB kernel (DESIGN §3.4), NVIDIA's PolyWarmUpScheduler as DeepLearningExamples BERT drives it (§3.5), and
the step's accumulation, loss scaling, clipping and skipped updates (§4, §6)."""

from __future__ import annotations

import copy
import math
import socket
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn

from bertforge.optim.lamb import Lamb, param_groups
from bertforge.optim.schedule import lr_at
from bertforge.runtime.step import TrainStep, train_step

CPU = torch.device("cpu")


class Toy(nn.Module):
    """Decay and no-decay parameters, and a zero weight (trust ratio 1)."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(6, 5)
        self.LayerNorm = nn.LayerNorm(5)
        self.out = nn.Linear(5, 3, bias=False)
        self.zero = nn.Parameter(torch.zeros(3))

    def forward(self, x, y=None):
        h = self.out(self.LayerNorm(self.dense(x))) + self.zero
        return SimpleNamespace(loss=h.square().mean() if y is None else (h - y).square().mean())


def apex_lamb_step(groups, state, lr, betas, eps, max_grad_norm, step):
    """apex FusedLAMB's two stages written out (adam_w_mode, grad_averaging, bias_correction, use_nvlamb False):
    stage 1 divides each gradient by ‖g‖/max_grad_norm when the global norm exceeds it, then the moments and
    u = m̂/(√v̂ + eps) + wd·w; stage 2 steps by lr·‖w‖/‖u‖ where wd ≠ 0 and both norms are non-zero, else lr."""
    b1, b2 = betas
    norm = math.sqrt(sum(float(p.grad.double().square().sum()) for ps, _ in groups for p in ps))
    clipped = norm / max_grad_norm if max_grad_norm > 0 and norm > max_grad_norm else 1.0
    for params, wd in groups:
        for p in params:
            s = state.setdefault(p, {"m": torch.zeros_like(p), "v": torch.zeros_like(p)})
            g = p.grad / clipped
            s["m"] = b1 * s["m"] + (1 - b1) * g
            s["v"] = b2 * s["v"] + (1 - b2) * g * g
            u = (s["m"] / (1 - b1**step)) / ((s["v"] / (1 - b2**step)).sqrt() + eps) + wd * p.detach()
            w_norm, u_norm = float(p.detach().norm()), float(u.norm())
            ratio = lr * w_norm / u_norm if wd != 0 and w_norm != 0 and u_norm != 0 else lr
            p.data.add_(u, alpha=-ratio)


@pytest.mark.parametrize("max_grad_norm", [0.0, 1.0])
def test_lamb_is_apexs_fused_lamb(max_grad_norm):
    torch.manual_seed(0)
    model = Toy().double()
    ref = copy.deepcopy(model)
    opt = Lamb(param_groups(model, 0.01), lr=2e-2, max_grad_norm=max_grad_norm)
    groups = [(g["params"], g["weight_decay"]) for g in param_groups(ref, 0.01)]
    state: dict = {}
    gen = torch.Generator().manual_seed(0)
    for t in range(1, 31):
        x = torch.randn(8, 6, generator=gen, dtype=torch.float64) * (1 + t % 4)
        for m in (model, ref):
            m.zero_grad()
            m(x).loss.backward()
        opt.step()
        apex_lamb_step(groups, state, 2e-2, (0.9, 0.999), 1e-6, max_grad_norm, t)
    for (name, a), b in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14, msg=name)
    assert torch.count_nonzero(model.zero) > 0  # the zero weight moved by plain lr·u (trust 1), not by 0


def test_half_precision_parameters_keep_fp32_moments_across_a_state_dict_round_trip():
    """torch's Optimizer.load_state_dict casts state to the parameter's dtype: bf16 moments, and the next step
    failed in `_foreach_lerp_` (expected BFloat16 but got Float)."""
    torch.manual_seed(0)
    a = nn.Linear(8, 8).to(torch.bfloat16)
    b = copy.deepcopy(a)
    oa = Lamb(param_groups(a, 0.01), lr=1e-2)
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    a(x).float().square().mean().backward()
    oa.step()
    b.load_state_dict(a.state_dict())
    ob = Lamb(param_groups(b, 0.01), lr=1e-2)
    ob.load_state_dict(copy.deepcopy(oa.state_dict()))  # as from a file
    assert {s["exp_avg"].dtype for s in ob.state.values()} == {torch.float32}
    for m, o in ((a, oa), (b, ob)):
        m.zero_grad()
        m(-x).float().square().mean().backward()
        o.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
        torch.testing.assert_close(ob.state[q]["exp_avg_sq"], oa.state[p]["exp_avg_sq"], rtol=0, atol=0)


def test_the_global_norm_of_fp16_gradients_is_taken_in_fp32():
    """A finite norm above fp16's 65504 came out inf: the clip factor was 0 and the first moment stayed 0."""
    m = nn.Linear(64, 64).to(torch.float16)
    for p in m.parameters():
        p.grad = torch.full_like(p, 2000.0)
    opt = Lamb(param_groups(m, 0.01), lr=1e-3, max_grad_norm=1.0)
    norm = 2000.0 * math.sqrt(64 * 64 + 64)
    torch.testing.assert_close(opt.global_grad_norm(), torch.tensor(norm), rtol=1e-6, atol=0)
    opt.step()
    torch.testing.assert_close(opt.state[m.weight]["exp_avg"], torch.full((64, 64), 0.1 * 2000.0 / norm))


class PolyWarmUpScheduler:
    """NVIDIA DeepLearningExamples BERT `schedulers.PolyWarmUpScheduler`, transcribed: `step()` runs right before
    `optimizer.step()` and reads the optimizer's step count, so update n uses progress n / total_steps."""

    def __init__(self, optimizer, warmup, total_steps, degree=0.5):
        self.optimizer, self.warmup, self.total_steps, self.degree = optimizer, warmup, total_steps, degree
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]

    def step(self):
        group = self.optimizer.param_groups[0]
        last_epoch = group["step"] + 1 if "step" in group else 1
        progress = last_epoch / self.total_steps
        for g, base in zip(self.optimizer.param_groups, self.base_lrs):
            g["lr"] = base * progress / self.warmup if progress < self.warmup else base * (1 - progress) ** self.degree


@pytest.mark.parametrize(("base_lr", "total", "warmup"), [(6e-3, 7038, 0.2843), (4e-3, 1563, 0.128), (1e-3, 50, 0.0)])
def test_poly_is_nvidias_scheduler_update_for_update_and_restarts_with_phase_2(base_lr, total, warmup):
    """Every update of a phase (its step counted from 0 again in phase 2, as run_pretraining.py --phase2 sets the
    loaded optimizer's step), with a skipped update in the middle that advances neither."""
    opt = Lamb([nn.Parameter(torch.ones(2))], lr=base_lr)
    opt.param_groups[0]["step"] = 0  # phase 2: the moments kept, the step reset
    sched = PolyWarmUpScheduler(opt, warmup, total)
    ours = []
    for n in range(1, total + 1):
        sched.step()
        ours.append(lr_at(opt.param_groups[0]["step"] + 1, base_lr, total, warmup, "poly"))
        assert ours[-1] == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12, abs=1e-18), n
        if n == total // 2:  # a skipped update: neither the step nor the lr moves on
            continue
        opt.param_groups[0]["step"] += 1
    first = base_lr * (1 / total) / warmup if warmup else base_lr * (1 - 1 / total) ** 0.5
    assert ours[0] == pytest.approx(first, rel=1e-12)  # the first update already has progress 1 / total


@pytest.mark.parametrize("kind", ["poly", "linear", "wsd"])
def test_every_schedule_is_zero_at_max_steps_and_after_and_never_negative(kind):
    """Past max_steps (a phase resumed with a lower train.max_steps) NVIDIA's formula takes a fractional power of
    a negative number; ours stays at 0."""
    lrs = [lr_at(s, 1e-3, 40, 0.1, kind, decay=0.2) for s in range(1, 61)]
    assert all(lr >= 0 for lr in lrs) and max(lrs) == pytest.approx(1e-3, rel=0.2)
    # linear is Hugging Face's, one update behind (its last update is above 0); the others reach 0 at max_steps
    zero_from = 41 if kind == "linear" else 40
    assert lrs[zero_from - 1 :] == [0.0] * (61 - zero_from) and lrs[zero_from - 2] > 0


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(6, 3)

    def forward(self, x):
        return SimpleNamespace(loss=self.dense(x).square().mean())


def _step(model, precision="fp32", scaler=None, max_grad_norm=1.0, opt=None):
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.1)
    return TrainStep.build(model, opt, CPU, precision, max_grad_norm=max_grad_norm, scaler=scaler)


def test_the_scaler_unscales_before_clipping_and_the_global_norm_is_the_unscaled_one():
    torch.manual_seed(0)
    plain = Scaled()
    scaled = copy.deepcopy(plain)
    x = torch.randn(4, 6) * 10  # a norm well above max_grad_norm: the clip is active
    a = train_step(_step(plain), [{"x": x}], 1)
    # a power-of-two loss scale is exact: unscaled first, the clip and the update are the plain run's bit for bit
    b = train_step(_step(scaled, scaler=torch.amp.GradScaler("cpu", init_scale=2.0**12)), [{"x": x}], 1)
    assert a.finite and b.finite and float(a.grad_norm) > 1.0
    assert torch.equal(a.grad_norm, b.grad_norm)
    for p, q in zip(plain.parameters(), scaled.parameters()):
        assert torch.equal(p, q)


def test_a_non_finite_step_is_skipped_backs_the_scale_off_and_leaves_lamb_s_step_count():
    torch.manual_seed(0)
    model = Scaled()
    before = copy.deepcopy(model.state_dict())
    opt = Lamb(param_groups(model, 0.01), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    step = _step(model, scaler=scaler, opt=opt)
    bad = train_step(step, [{"x": torch.full((4, 6), math.inf)}], 1)
    assert not bad.finite and scaler.get_scale() == 2.0**9
    assert all(g["step"] == 0 for g in opt.param_groups) and not opt.state
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())  # cleared: the next update starts from zero
    for _ in range(2):  # growth_interval finite steps in a row grow the scale back
        assert train_step(step, [{"x": torch.randn(4, 6)}], 1).finite
    assert scaler.get_scale() == 2.0**10 and all(g["step"] == 2 for g in opt.param_groups)


def test_micro_batches_of_unequal_size_weighted_by_their_rows_equal_the_whole_batch():
    torch.manual_seed(0)
    whole = Scaled()
    parts = copy.deepcopy(whole)
    x = torch.randn(5, 6)
    a = train_step(_step(whole, max_grad_norm=0.0), [{"x": x}], 1)
    b = train_step(_step(parts, max_grad_norm=0.0), [{"x": x[:4]}, {"x": x[4:]}], 2, weights=[4 / 5, 1 / 5])
    torch.testing.assert_close(b.loss, a.loss, rtol=1e-6, atol=0)
    torch.testing.assert_close(b.grad_norm, a.grad_norm, rtol=1e-6, atol=0)
    for p, q in zip(whole.parameters(), parts.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)


@pytest.fixture
def one_process_group():
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group already in this process")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("accum", [1, 4])
def test_ddp_all_reduces_once_per_update_and_matches_plain_accumulation(one_process_group, accum):
    torch.manual_seed(0)
    model = Scaled()
    plain = copy.deepcopy(model)
    wrapped = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    reduces = []

    def count(state, bucket):
        reduces.append(1)
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(bucket.buffer())  # one process: the sum is the buffer itself
        return fut

    wrapped.register_comm_hook(None, count)
    ddp_step = TrainStep.build(model, torch.optim.SGD(model.parameters(), lr=0.1), CPU, "fp32", 1.0, ddp=wrapped)
    xs = [torch.randn(3, 6) for _ in range(accum)]
    for update in range(2):
        train_step(ddp_step, [{"x": x} for x in xs], accum)
        assert len(reduces) == update + 1
    plain_step = _step(plain)
    for _ in range(2):
        train_step(plain_step, [{"x": x} for x in xs], accum)
    for p, q in zip(plain.parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)
