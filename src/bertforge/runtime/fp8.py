"""FP8 training with torchao's float8 (tensorwise dynamic scaling), applied to the model from outside, with the
guardrails DESIGN §4 asks for: non-finite steps are skipped and counted by `runtime.step`, and after
`fallback_after` of them in a row the model goes back to bf16 matmuls for the rest of the run.

    n = convert(model)                   # encoder and MLM-transform nn.Linear -> torchao Float8Linear
    guard = Fp8Guard(fallback_after=3)
    if guard.observe(result.finite): revert(model)   # back to plain nn.Linear, same Parameters

Only linears whose both dimensions are multiples of 16 (the FP8 tensor-core rule) and at least 256 wide are
converted: the small heads (NSP's 2 outputs, classifiers) stay in bf16, where FP8's scaling costs more than it
saves. `convert` and `revert` keep the very same Parameter objects, so the optimizer's state and checkpoints
(state_dict keys) are unchanged either way. `emulate=True` runs the FP8 casts in plain PyTorch (CPU tests).
"""

from __future__ import annotations

import torch
from torch import nn

from bertforge.model.bert import encoder_layers

MIN_WIDTH = 256


def fp8_usable(device: torch.device) -> bool:
    """FP8 tensor cores: NVIDIA compute capability 8.9 (Ada) or 9.0+ (Hopper), with torchao installed."""
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        return False
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def _eligible(module: nn.Module, fqn: str) -> bool:
    if not isinstance(module, nn.Linear):
        return True  # let torchao walk into containers
    dims = (module.in_features, module.out_features)
    return all(d % 16 == 0 and d >= MIN_WIDTH for d in dims)


def convert(model: nn.Module, emulate: bool = False) -> int:
    """Swap eligible nn.Linear layers for torchao Float8Linear in place; returns how many were swapped.

    The weight gradient's matmul (grad_output^T @ input) runs over the layer's rows, and `torch._scaled_mm` on
    CUDA needs that inner dimension in multiples of 16. An encoder layer's rows are the batch's tokens (fixed
    shapes under FP8, `step.wants_segments`); the pooler's are its sequences (micro-batch x NSP slots) and the
    MLM transform's its masked slots, which any micro-batch size can give: pretrain_large_512's micro-batch of 8
    hands the pooler 8 rows. Those layers pad the inner dimensions to 16 (torchao's `pad_inner_dim`, zeros that
    add nothing to the product); the encoder's layers, where the copy would cost on every matmul, do not."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    in_layers = {id(m) for layer in encoder_layers(model, "convert to FP8") for m in layer.modules()}
    for padded in (False, True):

        def pick(module: nn.Module, fqn: str, padded: bool = padded) -> bool:
            if isinstance(module, Float8Linear):  # a subclass of nn.Linear: converted by the first pass
                return False
            return _eligible(module, fqn) and (id(module) not in in_layers) == padded

        config = Float8LinearConfig(emulate=emulate, pad_inner_dim=padded)
        convert_to_float8_training(model, module_filter_fn=pick, config=config)
    return sum(isinstance(m, Float8Linear) for m in model.modules())


def revert(model: nn.Module) -> int:
    """Swap every Float8Linear back to nn.Linear sharing its weight and bias; returns how many were swapped."""
    from torchao.float8.float8_linear import Float8Linear

    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Float8Linear):
                plain = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None, device="meta")
                plain.weight, plain.bias = child.weight, child.bias
                setattr(parent, name, plain)
                n += 1
    return n


class Fp8Guard:
    """Counts non-finite steps in a row under FP8; says when to fall back to bf16 (once)."""

    def __init__(self, fallback_after: int = 3):
        self.fallback_after = fallback_after
        self.in_a_row = 0
        self.active = True

    def observe(self, finite: bool) -> bool:
        """Record a step; True exactly once, when the run should leave FP8."""
        if not self.active:
            return False
        self.in_a_row = 0 if finite else self.in_a_row + 1
        if self.in_a_row >= self.fallback_after:
            self.active = False
            return True
        return False
