"""Learning-rate schedules as pure functions of the step (DESIGN §3.5), by name.

    lr = lr_at(step, base_lr=6e-3, max_steps=7038, warmup=0.2843, kind="poly")

`step` is the 1-based number of the update about to be taken, counting successful updates only (a skipped
non-finite step does not advance it). This matches NVIDIA DeepLearningExamples BERT, which calls
`lr_scheduler.step()` right before `optimizer.step()`, so its first update already uses progress 1/max_steps.

In phase 2 the step is local to the phase: a phase-2 run started from a phase-1 checkpoint counts from 0
again (`phase_step`), and a resume in the middle of phase 2 continues from the phase-2 step it saved.
"""

from __future__ import annotations


def poly_warmup(step: int, base_lr: float, max_steps: int, warmup: float, degree: float = 0.5) -> float:
    """NVIDIA PolyWarmUpScheduler: linear warmup over a fraction `warmup` of the steps, then (1 − p)^degree."""
    p = step / max_steps
    if p < warmup:
        return base_lr * p / warmup
    return base_lr * max(0.0, 1.0 - p) ** degree


def linear_warmup(step: int, base_lr: float, max_steps: int, warmup: float) -> float:
    """Google BERT / Hugging Face `get_linear_schedule_with_warmup`: linear up, then linear down to 0."""
    warmup_steps = warmup * max_steps
    if step < warmup_steps:
        return base_lr * step / warmup_steps
    return base_lr * max(0.0, (max_steps - step) / max(1.0, max_steps - warmup_steps))


SCHEDULES = {"poly": poly_warmup, "linear": linear_warmup}


def lr_at(step: int, base_lr: float, max_steps: int, warmup: float, kind: str = "poly") -> float:
    """The learning rate of update number `step` (1-based, successful updates only) of a phase."""
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule {kind!r}; use one of {', '.join(SCHEDULES)}")
    return SCHEDULES[kind](step, base_lr, max_steps, warmup)


def phase_step(global_step: int, phase_offset: int) -> int:
    """Phase-local step from a run-wide step count: phase 2 starts at `phase_offset` = phase-1's steps."""
    if global_step < phase_offset:
        raise ValueError(f"global step {global_step} is before the phase start {phase_offset}")
    return global_step - phase_offset
