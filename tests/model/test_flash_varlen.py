"""model.flash_varlen's plumbing without a GPU: the custom op's shapes (aten's own meta kernels), its backward
wired to the backward op with the forward's dropout seed and offset, and torch.compile seeing both as single
opaque kernels. The numbers are checked on CUDA (test_gpu_varlen.py: output and gradients against a float32
reference with the dropout mask the kernel drew)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from bertforge.model import BertConfig, build_model
from bertforge.model import attention as attn
from bertforge.model.flash_varlen import flash_heads, flash_varlen

from .test_model import packed_and_padded, tiny


def inputs(device="meta"):
    q, k, v = (torch.empty(11, 2, 16, dtype=torch.bfloat16, device=device).requires_grad_() for _ in range(3))
    return q, k, v, torch.tensor([0, 4, 11], dtype=torch.int32).to(device)


def test_shapes_and_backward_on_meta_tensors():
    q, k, v, cu = inputs()
    out = flash_varlen(q, k, v, cu, 7, dropout_p=0.1, half_window=3)
    assert out.shape == q.shape and out.dtype == q.dtype
    out.sum().backward()
    assert all(x.grad is not None and x.grad.shape == x.shape for x in (q, k, v))


def test_traced_step_holds_one_forward_and_one_backward_kernel_sharing_the_dropout_state():
    q, k, v, cu = inputs("cpu")

    def step(q, k, v, cu):
        out = flash_varlen(q, k, v, cu, 7, dropout_p=0.1, half_window=None)
        return torch.autograd.grad(out.float().sum(), (q, k, v))

    graph = make_fx(step, tracing_mode="fake")(q, k, v, cu).graph
    fwd = [n for n in graph.nodes if n.target is torch.ops.bertforge.flash_varlen.default]
    bwd = [n for n in graph.nodes if n.target is torch.ops.bertforge.flash_varlen_backward.default]
    assert len(fwd) == 1 and len(bwd) == 1
    assert not [n for n in graph.nodes if "flash_attention" in str(n.target)]  # opaque: aten's ops inside
    args = bwd[0].args  # grad, q, k, v, out, lse, cu_seqlens, max_seqlen, dropout_p, seed, offset, left, right
    assert args[7:9] == (7, 0.1) and args[11:] == (-1, -1)
    # out, logsumexp and the Philox seed and offset are the forward's own outputs: the backward regenerates
    # the mask the forward drew
    assert [origin(args[i]) for i in (4, 5, 9, 10)] == [(fwd[0], 0), (fwd[0], 1), (fwd[0], 2), (fwd[0], 3)]


def origin(node):
    """(producer, output index) of a traced value, through the detaches autograd puts on saved tensors."""
    while node.target is torch.ops.aten.detach.default:
        node = node.args[0]
    return node.args


def test_not_used_off_cuda_or_on_heads_the_kernel_does_not_take():
    assert not attn.varlen_usable(torch.zeros(2, 8, dtype=torch.bfloat16), 64)
    assert [flash_heads(d) for d in (8, 64, 256, 12, 264)] == [True, True, True, False, False]


def test_tagged_random_so_a_compiled_recompute_replays_its_rng_state():
    assert torch.Tag.nondeterministic_seeded in torch.ops.bertforge.flash_varlen.default.tags


@pytest.mark.parametrize("modern", [False, True])
def test_the_models_segmented_flash_path_runs_the_op_on_meta_tensors(monkeypatch, modern):
    """The encoder's flash path with the real op (aten's meta kernels standing in for CUDA): bf16 forward, loss
    and backward wire up, every layer calls the op with the training dropout rate and, for ModernBERT's local
    layers, the half window."""
    calls = []

    def spy(q, k, v, cu_seqlens, max_seqlen, dropout_p=0.0, half_window=None):
        calls.append((dropout_p, half_window))
        return flash_varlen(q, k, v, cu_seqlens, max_seqlen, dropout_p, half_window)

    monkeypatch.setattr(attn, "varlen_usable", lambda h, d: True)
    monkeypatch.setattr(attn, "VARLEN_KERNEL", ("torch", spy))
    if modern:
        config = BertConfig.from_preset(
            "modernbert-tiny", vocab_size=97, local_attention=8, attention_probs_dropout_prob=0.1
        )
        model, task = build_model(config, "mlm"), "mlm"
    else:
        model, task = build_model(tiny(attention_probs_dropout_prob=0.1), "pretraining"), "pretraining"
    _, packed, _ = packed_and_padded()
    if task == "mlm":
        packed = {k: v for k, v in packed.items() if not k.startswith(("nsp", "token_type"))}
    cu = attn.segment_bounds(packed["attention_mask"])
    model = model.to("meta", torch.bfloat16).train()
    out = model(**{k: v.to("meta") for k, v in packed.items()}, cu_seqlens=cu.to("meta"))
    out.loss.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.bfloat16 for p in model.parameters())
    layers = model.config.num_hidden_layers
    windows = [None if i % 3 == 0 else 4 for i in range(layers)] if modern else [None] * layers
    assert calls == [(0.1, w) for w in windows]
