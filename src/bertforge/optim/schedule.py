"""Learning-rate schedules as pure functions of the step (DESIGN §3.5), by name.

    lr = lr_at(step, base_lr=6e-3, max_steps=7038, warmup=0.2843, kind="poly")

`step` is the 1-based number of the update about to be taken, counting successful updates only (a skipped
non-finite step does not advance it). This matches NVIDIA DeepLearningExamples BERT, which calls
`lr_scheduler.step()` right before `optimizer.step()`, so its first update already uses progress 1/max_steps.
`linear` follows Hugging Face, whose scheduler steps after the update (its first update uses step 0).

`wsd` is the warmup-stable-decay ("trapezoidal") schedule of MiniCPM (Hu et al. 2024, arXiv 2404.06395) and
Hägele et al. 2024 (arXiv 2405.18392): linear warmup, the peak held, then a decay to 0 over the last
`decay` fraction of the steps, linear or "1-sqrt" (the latter matches cosine at a fraction of the cost; ModernBERT
trains with it).

In phase 2 the step is local to the phase: a phase-2 run started from a phase-1 checkpoint counts from 0
again (`phase_step`), and a resume in the middle of phase 2 continues from the phase-2 step it saved.
"""

from __future__ import annotations

import math


def poly_warmup(step: int, base_lr: float, max_steps: int, warmup: float, degree: float = 0.5) -> float:
    """NVIDIA PolyWarmUpScheduler: linear warmup over a fraction `warmup` of the steps, then (1 − p)^degree."""
    p = step / max_steps
    if p < warmup:
        return base_lr * p / warmup
    return base_lr * max(0.0, 1.0 - p) ** degree


def linear_warmup(step: int, base_lr: float, max_steps: int, warmup: float) -> float:
    """Hugging Face `get_linear_schedule_with_warmup` as the Trainer sets it up (run_glue, run_qa): linear up over
    ceil(warmup * max_steps) updates, then linear down to 0 at max_steps. HF steps its scheduler after each
    update, so update `step` (1-based) runs at HF's step - 1: the first at 0 when there is a warmup, the last
    above 0. (Google's optimization.py decays over all the steps, not the steps after the warmup.)"""
    s = step - 1
    warmup_steps = math.ceil(warmup * max_steps)
    if s < warmup_steps:
        return base_lr * s / max(1, warmup_steps)
    return base_lr * max(0.0, (max_steps - s) / max(1, max_steps - warmup_steps))


DECAY_SHAPES = ("linear", "1-sqrt")


def warmup_stable_decay(
    step: int, base_lr: float, max_steps: int, warmup: float, decay: float = 0.1, shape: str = "linear"
) -> float:
    """WSD / trapezoidal: linear warmup over `warmup` of the steps, base_lr until the last `decay` fraction, then
    down to 0 at max_steps: linearly, or as 1 - sqrt(x) of the decay's progress x (Hägele et al. 2024, eq. 1)."""
    if shape not in DECAY_SHAPES:
        raise ValueError(f"unknown decay shape {shape!r}; use one of {', '.join(DECAY_SHAPES)}")
    warmup_steps = warmup * max_steps
    decay_steps = decay * max_steps
    if step < warmup_steps:
        return base_lr * step / warmup_steps
    decay_start = max_steps - decay_steps
    if step <= decay_start or decay_steps <= 0:
        return base_lr
    x = min(1.0, (step - decay_start) / decay_steps)  # progress through the decay, (0, 1]
    return base_lr * (1.0 - (x if shape == "linear" else x**0.5))


SCHEDULES = {"poly": poly_warmup, "linear": linear_warmup, "wsd": warmup_stable_decay}


def lr_at(
    step: int,
    base_lr: float,
    max_steps: int,
    warmup: float,
    kind: str = "poly",
    decay: float = 0.1,
    decay_shape: str = "linear",
) -> float:
    """The learning rate of update number `step` (1-based, successful updates only) of a phase. `decay` and
    `decay_shape` are the wsd schedule's (fraction of the steps in the final decay; linear or 1-sqrt)."""
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule {kind!r}; use one of {', '.join(SCHEDULES)}")
    if kind == "wsd":
        return warmup_stable_decay(step, base_lr, max_steps, warmup, decay, decay_shape)
    return SCHEDULES[kind](step, base_lr, max_steps, warmup)


def phase_step(global_step: int, phase_offset: int) -> int:
    """Phase-local step from a run-wide step count: phase 2 starts at `phase_offset` = phase-1's steps."""
    if global_step < phase_offset:
        raise ValueError(f"global step {global_step} is before the phase start {phase_offset}")
    return global_step - phase_offset
