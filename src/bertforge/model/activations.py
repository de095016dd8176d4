"""Activation functions by Hugging Face `ACT2FN` name; the encoder's FFN and the MLM head's transform use
them, and `hf_interop` checks a checkpoint's `hidden_act` against them."""

from __future__ import annotations

import torch.nn.functional as F

# "gelu" is the exact erf GELU that BERT was trained with; the tanh forms are HF's "gelu_new" spellings
ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}
