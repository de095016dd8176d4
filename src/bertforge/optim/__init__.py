"""Optimizers (LAMB with NVLAMB semantics, AdamW) and learning-rate schedules."""

from bertforge.optim.lamb import Lamb, build_optimizer, param_groups
from bertforge.optim.schedule import lr_at

__all__ = ["Lamb", "build_optimizer", "lr_at", "param_groups"]
