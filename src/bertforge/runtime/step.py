"""One training step — the only one in bertforge: `bertforge pretrain`'s loop, fine-tuning and every benchmark
entry that times "our step" call `train_step`.

    step = TrainStep.build(model, optimizer, device, precision, max_grad_norm=1.0, compile=False)
    result = train_step(step, micro_batches, accum)      # forward, loss, backward x accum; clip; optimizer step
    if not result.finite: ...                              # non-finite gradients: the update was skipped

A step is `accum` micro-batches: each is moved to the device (non-blocking: pinned batches overlap the copy with
compute), run under autocast, its loss divided by `accum` and back-propagated (under DDP, `no_sync` on all but
the last, so gradients are all-reduced once per update). Then the fp16 scaler unscales, the global gradient norm
is clipped to `max_grad_norm` over all parameters, and one host sync decides: a finite norm steps the optimizer,
a non-finite one skips it (DESIGN §6) — the scaler lowers its scale either way, and the gradients are cleared.

`compile=True` compiles the forward and loss with torch.compile; AOTAutograd compiles the backward from the same
graph, so the whole forward-loss-backward is compiled. Static shapes (packed rows, a fixed number of masked
slots) give one graph; "reduce-overhead" adds CUDA graphs. `compile_scope="layers"` compiles each encoder layer
instead (regional compilation, `compile_model`): the same graph serves every layer, so compiling costs about one
layer's trace rather than the whole stack's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch._inductor import list_mode_options

from bertforge import device as dev
from bertforge.model.bert import encoder_layers
from bertforge.runtime import distributed as ddp
from bertforge.runtime.profile import StepTimeline

Batch = dict[str, torch.Tensor]


@dataclass
class TrainStep:
    """What one update needs; build it once per run."""

    model: torch.nn.Module
    """The module the forward calls: the model, or its DDP / compiled wrapper."""
    optimizer: torch.optim.Optimizer
    scaler: Any
    """`torch.amp.GradScaler` (enabled for fp16 only; a no-op otherwise)."""
    device: torch.device
    precision: str
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0: no clipping, the norm is still computed for the log)."""
    sync_owner: torch.nn.Module = field(default_factory=torch.nn.Module)
    """The DDP wrapper whose `no_sync` skips the all-reduce on early micro-batches (any other module: not
    distributed, nothing to skip)."""
    params: list[torch.nn.Parameter] = field(default_factory=list)
    graphed: bool = False
    """The compiled step replays from CUDA graphs (modes "reduce-overhead" and "max-autotune"): its backward writes
    gradients into the graphs' memory pool, which the next micro-batch's replay overwrites
    (`_grads_out_of_the_graph_pool`)."""
    timeline: StepTimeline | None = None
    """Set while `--profile` records: the step marks the end of each of its parts on it (runtime.profile)."""

    @classmethod
    def build(
        cls,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        precision: str,
        max_grad_norm: float = 1.0,
        compile: bool | str = False,
        ddp: torch.nn.Module | None = None,
        scaler: Any = None,
        compile_scope: str = "model",
    ) -> TrainStep:
        """`model` is the bare module; `ddp` its DistributedDataParallel wrapper when distributed; `compile` True
        (inductor's default mode) or a torch.compile mode name ("reduce-overhead", "max-autotune") and
        `compile_scope` what it compiles (`compile_model`); `scaler` a (restored) grad scaler, else a fresh one
        for the precision."""
        runner = ddp if ddp is not None else model
        if compile:
            runner = compile_model(runner, model, compile, compile_scope)
        scaler = scaler if scaler is not None else dev.grad_scaler(device, precision)
        return cls(
            runner,
            optimizer,
            scaler,
            device,
            precision,
            max_grad_norm,
            sync_owner=ddp if ddp is not None else model,
            params=[p for p in model.parameters() if p.requires_grad],
            graphed=isinstance(compile, str) and bool(list_mode_options(compile).get("triton.cudagraphs")),
        )


def compile_model(runner: torch.nn.Module, model: torch.nn.Module, mode: bool | str, scope: str) -> torch.nn.Module:
    """What a compiled step calls. scope "model": `runner` (the model or its DDP wrapper) compiled whole, one
    graph from the embeddings to the loss. scope "layers": each encoder layer of `model` compiled in place
    (`Module.compile`, so parameter names and the state dict stay the model's) and `runner` returned as it is;
    Dynamo lifts a layer's parameters to graph inputs, so one graph serves every layer of a kind and compiling
    BERT-large costs about what compiling one layer does, while embeddings, heads and loss run eager between."""
    named = mode if isinstance(mode, str) else None  # True: inductor's default mode
    if scope == "model":
        # compiling a Module returns an OptimizedModule, a Module; torch types it as a plain callable
        return cast(torch.nn.Module, torch.compile(runner, mode=named))
    if scope != "layers":
        raise ValueError(f"compile scope {scope!r}: use model or layers")
    for layer in encoder_layers(model, "compile; use compile scope model"):
        layer.compile(mode=named)
    return runner


@dataclass
class StepResult:
    finite: bool
    """False: the gradients were not finite and the update was skipped."""
    grad_norm: torch.Tensor
    """Global gradient norm before clipping (0-dim, on the device)."""
    loss: torch.Tensor
    """The weighted loss summed over the micro-batches, i.e. their mean by default (0-dim, detached, on the
    device)."""


def wants_segments(device: torch.device, attention: str, packed: bool, fixed: bool) -> bool:
    """Whether a run's batches should carry `cu_seqlens` for the segmented layout
    (`model.attention.segment_bounds`), which `attention="auto"` runs on the CUDA flash kernel: for packed rows
    (almost no padding to compute, and no gather or host sync) and for steps that need `fixed` shapes —
    compiled steps (one graph, CUDA graphs possible) and FP8 steps (`torch._scaled_mm` needs token counts in
    multiples of 16; unpadding leaves any count). Other eager steps keep unpadding (no compute on padding at
    all); the model ignores the bounds wherever flash is not usable, so this decides speed, never results."""
    return device.type == "cuda" and attention == "auto" and (packed or fixed)


def to_device(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr


def train_step(
    step: TrainStep,
    micro_batches: Iterable[Batch],
    accum: int,
    observe: Callable[[Any, Batch], None] | None = None,
    weights: Sequence[float] | None = None,
) -> StepResult:
    """One optimizer update over `accum` micro-batches (see the module docstring). `observe(output, batch)` sees
    each micro-batch's model output and device batch (the loop's metric sums); it must not sync the host.
    `weights`: each micro-batch's loss weight (default 1/accum each; fine-tuning weights a short last micro-batch
    by its share of the rows)."""
    mark = step.timeline.mark if step.timeline is not None else _unmarked
    loss_sum = torch.zeros((), device=step.device, dtype=torch.float32)
    for i, batch in enumerate(micro_batches):
        if i == 0:
            mark("start")  # once the first batch is here: waiting for it is time between updates
        batch = to_device(batch, step.device)
        with ddp.maybe_no_sync(step.sync_owner, i < accum - 1), dev.autocast(step.device, step.precision):
            out = step.model(**batch)
            loss = out.loss * (weights[i] if weights is not None else 1.0 / accum)
        loss_sum += loss.detach().float()
        if observe is not None:
            observe(out, batch)
        mark("forward")
        step.scaler.scale(loss).backward()
        if step.graphed and i == 0 and accum > 1:
            _grads_out_of_the_graph_pool(step.params)
        mark("backward")
    step.scaler.unscale_(step.optimizer)
    max_norm = step.max_grad_norm if step.max_grad_norm > 0 else math.inf
    # foreach left to torch (None): the multi-tensor kernels where the device has them (CUDA, XPU, CPU), one
    # tensor at a time elsewhere; foreach=True raised at the first update on MPS and HPU, which have none
    grad_norm = torch.nn.utils.clip_grad_norm_(step.params, max_norm, foreach=None)
    finite = bool(torch.isfinite(grad_norm).item())  # the one host sync per update
    mark("clip")
    if finite:
        step.scaler.step(step.optimizer)
    step.scaler.update()
    step.optimizer.zero_grad(set_to_none=True)
    if finite:
        mark("optimizer")
    return StepResult(finite, grad_norm.detach(), loss_sum)


def _grads_out_of_the_graph_pool(params: list[torch.nn.Parameter]) -> None:
    """Accumulation under CUDA graphs. The first micro-batch's backward hands its gradients to `.grad` as they
    are, in the graphs' memory pool; the next micro-batch's replay writes its own gradients over that memory
    (torch.compile's cudagraph trees then raise, or older releases silently keep one micro-batch's gradients).
    Copied out once per update, `.grad` is memory of its own, into which the later micro-batches add in place as
    in eager mode. One copy of the gradients per update; params without a gradient keep None, as in eager."""
    for p in params:
        if p.grad is not None:
            p.grad = p.grad.clone()


def _unmarked(part: str) -> None:
    """`train_step`'s part marks when no timeline records them."""
