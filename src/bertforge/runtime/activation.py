"""Activation checkpointing, applied to a built model from outside (DESIGN §2: the model holds no runtime
choices).

`apply_activation_checkpointing(model)` makes every encoder layer recompute its forward in the backward pass
(`torch.utils.checkpoint`, non-reentrant) while the layer is in training mode: activation memory of
O(1 layer) instead of O(layers), for about one more forward of compute.

Why not a wrapper module (`checkpoint_wrapper`): it inserts a level into the module tree, so parameter names
gain a `_checkpoint_wrapped_module.` part (LAMB's no-decay rules, optimizer state and DDP read them; only
the state_dict hides it with hooks). Here the layer object stays where it is and only its `forward` is
replaced on the instance, so names, `state_dict()` keys and parameter order are exactly the model's: a
checkpoint saved with checkpointing on loads with it off and back. Apply it before `torch.compile` and DDP.
"""

from __future__ import annotations

import types

from torch import nn
from torch.utils.checkpoint import checkpoint

from bertforge.model.bert import encoder_layers


def _checkpointed_forward(layer: nn.Module, *args, **kwargs):
    forward = type(layer).forward  # the class's own forward: the instance attribute is this function
    if layer.training:
        # the default preserve_rng_state replays the forward's dropout masks exactly in the recomputation
        return checkpoint(forward, layer, *args, use_reentrant=False, **kwargs)
    return forward(layer, *args, **kwargs)


def is_checkpointed(layer: nn.Module) -> bool:
    return getattr(layer.forward, "__func__", None) is _checkpointed_forward


def apply_activation_checkpointing(model: nn.Module) -> nn.Module:
    """Checkpoint every encoder layer of `model` (in place; returned for chaining). Applying it twice is the
    same as once; a model without encoder layers is an error rather than a silent no-op."""
    for layer in encoder_layers(model, "checkpoint"):
        if not is_checkpointed(layer):
            # an instance attribute shadows the class's forward for this layer only (is_checkpointed tests it)
            layer.forward = types.MethodType(_checkpointed_forward, layer)
    return model
