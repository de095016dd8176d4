"""LAMB with NVIDIA NVLAMB semantics (DESIGN §3.4), parameter groups by name, and the optimizer factory.

    groups = param_groups(model, weight_decay=0.01)       # decay / no-decay by name
    opt = Lamb(groups, lr=6e-3)                            # foreach fast path
    opt = optimizer_for(model, cfg.optim, device.type)     # lamb or adamw from a config

One step (You et al. 2019, arXiv 1904.00962, as in NVIDIA apex `FusedLAMB` / DeepLearningExamples BERT):
1. optional global clipping: every gradient is scaled by max_grad_norm / max(‖g‖, max_grad_norm), where ‖g‖ is
   the norm over *all* parameters of all groups (apex computes one "blended" norm, not one per group);
2. t += 1; m ← β1·m + (1−β1)·g; v ← β2·v + (1−β2)·g²; bias-corrected m̂ = m/(1−β1ᵗ), v̂ = v/(1−β2ᵗ);
3. u = m̂ / (√v̂ + eps) + wd·w                       (decoupled, AdamW-style weight decay);
4. trust = ‖w‖/‖u‖ if wd ≠ 0 and both norms > 0, else 1  (apex `use_nvlamb=False`: no-decay groups get a
   plain Adam step);
5. w ← w − lr·trust·u.

`Lamb.step` is the foreach fast path (a handful of multi-tensor kernels per group, no host sync);
`reference_lamb_step` is the plain per-tensor loop it is tested against (tests/train/test_lamb.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import torch
from torch import nn

# Names that get no weight decay (Google BERT `exclude_from_weight_decay`, NVIDIA's `no_decay` list; "gamma"
# and "beta" are the TF LayerNorm names that converted checkpoints keep; "norm." is ModernBERT's norms,
# embeddings.norm / attn_norm / mlp_norm / final_norm).
NO_DECAY_KEYS = ("bias", "gamma", "beta", "LayerNorm", "layer_norm", "norm.")


def param_groups(
    model: nn.Module, weight_decay: float, no_decay: Sequence[str] = NO_DECAY_KEYS
) -> list[dict[str, Any]]:
    """Two optimizer groups by parameter name: decay (wd = weight_decay) and no-decay (wd = 0).

    Shared parameters (the MLM decoder tied to the word embeddings) appear once. Frozen parameters
    (requires_grad False) are left out. Each group carries the parameter names, for checkpoints and debugging.
    """
    decay: list[tuple[str, nn.Parameter]] = []
    skip: list[tuple[str, nn.Parameter]] = []
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (skip if any(k in name for k in no_decay) else decay).append((name, p))
    groups = []
    for items, wd in ((decay, weight_decay), (skip, 0.0)):
        if items:
            groups.append({"params": [p for _, p in items], "names": [n for n, _ in items], "weight_decay": wd})
    return groups


def _math_dtype(p: torch.Tensor) -> torch.dtype:
    """fp32 moments and math for half-precision parameters; fp32/fp64 parameters keep their own dtype."""
    return p.dtype if p.dtype in (torch.float32, torch.float64) else torch.float32


class Lamb(torch.optim.Optimizer):
    """LAMB (NVLAMB semantics, module docstring); moments are at least fp32 whatever the parameter dtype.

    `compile=True` runs each group's update (`lamb_update`) through torch.compile: inductor fuses its dozen
    multi-tensor passes over the parameters, moments and gradients into a few kernels. The step's changing
    numbers (lr, bias corrections, clip) reach it as one small tensor, so one graph per group serves the whole
    run (compiled once, at the first step)."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 6e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        max_grad_norm: float = 0.0,
        compile: bool = False,
    ):
        if lr <= 0 or eps <= 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"Lamb: invalid lr {lr}, eps {eps} or betas {betas}")
        defaults = dict(
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, max_grad_norm=max_grad_norm, step=0
        )
        super().__init__(params, defaults)
        self._update = torch.compile(lamb_update, dynamic=False) if compile else lamb_update
        self._numbers: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}  # lr, bias corrections, clip

    @torch.no_grad()
    def global_grad_norm(self) -> torch.Tensor:
        """‖g‖ over every parameter of every group (a 0-dim tensor on the parameters' device)."""
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return torch.zeros(())
        # half-precision gradients' norms come out in fp32: in their own dtype a norm above 65504 (fp16) would be
        # inf, the clip factor 0 and the step an update of weight decay alone
        full: list[torch.Tensor] = []
        half: list[torch.Tensor] = []
        for g in grads:
            (full if g.dtype == _math_dtype(g) else half).append(g)
        norms = list(torch._foreach_norm(full)) if full else []
        norms += torch._foreach_norm(half, 2, dtype=torch.float32) if half else []
        dtype = torch.float64 if any(n.dtype == torch.float64 for n in norms) else torch.float32
        return torch.linalg.vector_norm(torch.stack([n.to(dtype) for n in norms]))

    @torch.no_grad()
    def step(self, closure=None, grad_norm: torch.Tensor | None = None):
        """One update. `grad_norm`: the already computed global gradient norm (saves recomputing it)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        max_norm = max(g["max_grad_norm"] for g in self.param_groups)
        clip = None
        if max_norm > 0:
            norm = self.global_grad_norm() if grad_norm is None else grad_norm
            # apex FusedLAMB: clipped_ratio = max_grad_norm / max(global_grad_norm, max_grad_norm)
            clip = max_norm / torch.clamp(norm, min=max_norm)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            beta1, beta2 = group["betas"]
            group["step"] += 1  # the step counts successful updates only: the loop skips non-finite ones
            t = group["step"]
            grads, exp_avg, exp_avg_sq = [], [], []
            for p in params:
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p, dtype=_math_dtype(p), memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=_math_dtype(p), memory_format=torch.preserve_format)
                grads.append(p.grad.to(_math_dtype(p)))
                exp_avg.append(state["exp_avg"])
                exp_avg_sq.append(state["exp_avg_sq"])
            dtype = torch.float64 if any(p.dtype == torch.float64 for p in params) else torch.float32
            numbers = self._step_numbers(
                params[0].device, dtype, group["lr"], 1 - beta1**t, math.sqrt(1 - beta2**t), clip
            )
            wd = float(group["weight_decay"])
            update = self._update(
                params, grads, exp_avg, exp_avg_sq, numbers, beta1, beta2, group["eps"], wd, clip is not None
            )
            for p, u in zip(params, update or []):  # half-precision parameters: fp32 update, rounded once
                p.add_(u.to(p.dtype))
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's, except that half-precision parameters keep fp32 moments: torch casts every floating state
        tensor to its parameter's dtype, which would round the moments to 16 bits and make the next step's fp32
        math fail on them (`_foreach_lerp_`: expected BFloat16 but got Float)."""
        super().load_state_dict(state_dict)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]  # torch pairs them in this order
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in zip(saved_ids, params):
            saved = state_dict["state"].get(i)
            if saved is None or p.dtype == _math_dtype(p):
                continue
            for key in ("exp_avg", "exp_avg_sq"):
                if key in saved:
                    self.state[p][key] = saved[key].to(device=p.device, dtype=_math_dtype(p))

    def _step_numbers(
        self,
        device: torch.device,
        dtype: torch.dtype,
        lr: float,
        bc1: float,
        sqrt_bc2: float,
        clip: torch.Tensor | None,
    ) -> torch.Tensor:
        """[lr, 1 − β1ᵗ, √(1 − β2ᵗ), clip] on the parameters' device in their math dtype, written in place with
        fills (kernel arguments: no host sync, and no host buffer that a later step could overwrite before it
        is read)."""
        numbers = self._numbers.get((device, dtype))
        if numbers is None:
            numbers = self._numbers[(device, dtype)] = torch.ones(4, dtype=dtype, device=device)
        for i, v in enumerate((lr, bc1, sqrt_bc2)):
            numbers[i].fill_(v)
        if clip is not None:
            numbers[3].copy_(clip)
        return numbers


def lamb_update(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avg: list[torch.Tensor],
    exp_avg_sq: list[torch.Tensor],
    numbers: torch.Tensor,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    clipped: bool,
) -> list[torch.Tensor] | None:
    """One group's LAMB update in multi-tensor ops (steps 2–5 of the module docstring), in place on the moments
    and — when every parameter is in its math dtype — on the parameters; otherwise the fp32 updates are returned
    for the caller to add. `numbers` = [lr, 1 − β1ᵗ, √(1 − β2ᵗ), clip] (clip read only when `clipped`)."""
    lr, bc1, sqrt_bc2, clip = numbers.unbind()
    if clipped:
        grads = list(torch._foreach_mul(grads, clip))
    # m ← β1 m + (1−β1) g ;  v ← β2 v + (1−β2) g²
    torch._foreach_lerp_(exp_avg, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sq, beta2)
    torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)
    # u = m̂ / (√v̂ + eps) + wd·w
    denom = torch._foreach_sqrt(exp_avg_sq)
    torch._foreach_div_(denom, sqrt_bc2)
    torch._foreach_add_(denom, eps)
    update = torch._foreach_div(exp_avg, denom)
    torch._foreach_div_(update, bc1)
    math_params = [p.to(_math_dtype(p)) for p in params]
    if weight_decay != 0:
        torch._foreach_add_(update, math_params, alpha=weight_decay)
        w_norm = torch._foreach_norm(math_params)
        u_norm = torch._foreach_norm(update)
        # trust ratio ‖w‖/‖u‖, 1 where either norm is 0 (NVLAMB); computed on device, no host sync
        # one pass for −lr·trust (the ratio and the lr are folded into per-tensor scalars first)
        scale = [torch.where((w > 0) & (u > 0), w / u, torch.ones_like(w)) * -lr for w, u in zip(w_norm, u_norm)]
        torch._foreach_mul_(update, scale)
    else:
        torch._foreach_mul_(update, -lr)
    if all(p.dtype == _math_dtype(p) for p in params):
        torch._foreach_add_(params, update)
        return None
    return list(update)


def _grad(p: torch.Tensor) -> torch.Tensor:
    if p.grad is None:
        raise ValueError("reference_lamb_step: every parameter it is given needs a gradient")
    return p.grad


@torch.no_grad()
def reference_lamb_step(
    group_params: list[list[torch.Tensor]], group_opts: list[dict[str, Any]], state: dict[int, dict[str, Any]]
) -> None:
    """The plain per-tensor loop of DESIGN §3.4 (for tests only): one step over all groups, in place.

    `group_opts[i]` holds lr, betas, eps, weight_decay, max_grad_norm for group i; `state` maps id(param) to its
    moments and step (created on first use).
    """
    max_norm = max(o["max_grad_norm"] for o in group_opts)
    scale = 1.0
    if max_norm > 0:
        total = math.sqrt(sum(float((_grad(p).double() ** 2).sum()) for ps in group_params for p in ps))
        scale = max_norm / max(total, max_norm)
    for params, o in zip(group_params, group_opts):
        beta1, beta2 = o["betas"]
        for p in params:
            s = state.setdefault(id(p), {"m": torch.zeros_like(p), "v": torch.zeros_like(p), "t": 0})
            g = _grad(p) * scale
            s["t"] += 1
            s["m"] = beta1 * s["m"] + (1 - beta1) * g
            s["v"] = beta2 * s["v"] + (1 - beta2) * g * g
            m_hat = s["m"] / (1 - beta1 ** s["t"])
            v_hat = s["v"] / (1 - beta2 ** s["t"])
            u = m_hat / (v_hat.sqrt() + o["eps"]) + o["weight_decay"] * p
            trust = 1.0
            if o["weight_decay"] != 0:
                w_norm, u_norm = float(p.norm()), float(u.norm())
                if w_norm > 0 and u_norm > 0:
                    trust = w_norm / u_norm
            p.sub_(o["lr"] * trust * u)


class OptimSection(Protocol):
    """What `optimizer_for` reads of a run's `optim` section (`config.OptimConfig`, which imports this package)."""

    name: str
    lr: float
    weight_decay: float
    beta1: float
    beta2: float
    eps: float
    compile: bool | None


def optimizer_for(model: nn.Module, o: OptimSection, device_type: str) -> torch.optim.Optimizer:
    """`build_optimizer` from a run's `optim` section (its auto settings resolved: `config.resolve_auto`)."""
    return build_optimizer(model, o.name, o.lr, o.weight_decay, (o.beta1, o.beta2), o.eps, device_type, bool(o.compile))


def build_optimizer(
    model: nn.Module,
    name: str,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
    device_type: str = "cpu",
    compile: bool = False,
) -> torch.optim.Optimizer:
    """`lamb` (ours, foreach; `compile`: its update compiled) or `adamw` (torch's fused kernel on CUDA and the CPU,
    foreach elsewhere), no-decay by name.

    Gradient clipping is done by the training loop (one global norm for both optimizers), so LAMB's own
    max_grad_norm stays 0 here.
    """
    groups = param_groups(model, weight_decay)
    if name == "lamb":
        return Lamb(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, compile=compile)
    if name == "adamw":
        return torch.optim.AdamW(
            groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **adamw_kernel(device_type)
        )
    raise ValueError(f"unknown optimizer {name!r}; use lamb or adamw")


def adamw_kernel(device_type: str) -> dict[str, Any]:
    """torch AdamW's kernel for a device type: fused (one pass per tensor) on CUDA and on the CPU (3.3x the
    foreach update for BERT-mini there, docs/BENCHMARKS.md), foreach elsewhere. The benchmarks' Hugging Face
    baseline uses it too, so both sides run the same kernel."""
    return {"fused": True} if device_type in ("cuda", "cpu") else {"foreach": True}
