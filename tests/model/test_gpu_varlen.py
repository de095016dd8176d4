"""The variable-length path on CUDA (flash-attn varlen, or torch's kernels through model.flash_varlen): no padding
compute, same per-sequence outputs and loss as the padded SDPA path. Needs a CUDA device (marker gpu)."""

from __future__ import annotations

import pytest
import torch

from bertforge.model import attention as attn
from bertforge.model import build_model

from .test_model import packed_and_padded, tiny

pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if attn.VARLEN_KERNEL is None:
        pytest.skip("no varlen flash kernel (flash-attn, or torch's aten::_flash_attention_forward)")
    return torch.device("cuda")


def test_varlen_path_is_taken_and_matches_padded_sdpa(cuda):
    torch.manual_seed(0)
    varlen = build_model(tiny(), "pretraining", attention="varlen").to(cuda).eval()
    sdpa = build_model(tiny(), "pretraining", attention="sdpa").to(cuda).eval()
    sdpa.load_state_dict(varlen.state_dict())
    padded, packed, where = packed_and_padded()
    padded = {k: v.to(cuda) for k, v in padded.items()}
    packed = {k: v.to(cuda) for k, v in packed.items()}
    calls = []
    real = attn.varlen
    attn.varlen = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            a = sdpa(**padded)
            b = varlen(**packed)
            c = varlen(**padded)
    finally:
        attn.varlen = real
    assert len(calls) == 2 * 2  # two forwards x two layers went through the varlen kernel
    for i, (r, off, n) in where.items():
        torch.testing.assert_close(
            b.last_hidden_state[r, off : off + n].float(), a.last_hidden_state[i, :n].float(), atol=3e-2, rtol=3e-2
        )
        torch.testing.assert_close(
            c.last_hidden_state[i, :n].float(), a.last_hidden_state[i, :n].float(), atol=3e-2, rtol=3e-2
        )
    torch.testing.assert_close(b.loss, a.loss, atol=3e-2, rtol=3e-2)
    b.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in varlen.parameters() if p.grad is not None)


def test_modernbert_sliding_window_in_the_flash_kernel(cuda):
    """ModernBERT on the flash path: the local layers' window through the kernel's window_size, rotary tables
    unpadded; same outputs as padded SDPA with the window in the mask, on rows longer than the window."""
    from bertforge.model import BertConfig

    config = BertConfig.from_preset("modernbert-tiny", vocab_size=97, local_attention=16)
    torch.manual_seed(0)
    varlen = build_model(config, "mlm", attention="varlen").to(cuda).eval()
    sdpa = build_model(config, "mlm", attention="sdpa").to(cuda).eval()
    sdpa.load_state_dict(varlen.state_dict())
    ids = torch.randint(3, 97, (3, 64), device=cuda)
    mask = (torch.arange(64, device=cuda)[None] < torch.tensor([64, 40, 9], device=cuda)[:, None]).long()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = sdpa(ids, mask).last_hidden_state.float(), varlen(ids, mask).last_hidden_state.float()
    real = mask.bool()
    torch.testing.assert_close(b[real], a[real], atol=3e-2, rtol=3e-2)


# ---- the varlen kernel with attention dropout (model.flash_varlen, or flash-attn's), checked exactly: the
#      dropout mask it drew is read back through values that are one-hot in the head dim, and a float32
#      reference with that mask must then give the same output and the same q/k/v gradients.

LENGTHS = (64, 37, 20, 5, 50)


def packed_qkv(device, dtype, heads=4, dim=64, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    n = sum(LENGTHS)
    q, k, v = (torch.randn(n, heads, dim, generator=g).mul(0.5).to(device, dtype) for _ in range(3))
    cu = torch.tensor((0, *torch.tensor(LENGTHS).cumsum(0).tolist()), dtype=torch.int32, device=device)
    return q, k, v, cu


def reference_probs(q, k, cu, half_window=None):
    """float32 attention probabilities within each sequence of cu: a list of (nh, L, L)."""
    probs = []
    bounds = cu.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        qs, ks = (x[a:b].float().transpose(0, 1) for x in (q, k))  # (nh, L, D)
        scores = qs @ ks.transpose(-1, -2) / qs.shape[-1] ** 0.5  # (nh, L, L)
        if half_window is not None:
            i = torch.arange(b - a, device=q.device)
            scores = scores.masked_fill((i[:, None] - i[None]).abs() > half_window, float("-inf"))
        probs.append(scores.softmax(-1))
    return probs


def reference(q, k, v, cu, keep, p, half_window=None):
    """float32 attention with the kernel's dropout mask: keep[s] (nh, L, L) drops the probabilities where
    False and scales the rest by 1 / (1 - p), as the kernel does. -> (N, nh, D)"""
    bounds = cu.tolist()
    out = []
    for s, probs in enumerate(reference_probs(q, k, cu, half_window)):
        vs = v[bounds[s] : bounds[s + 1]].float().transpose(0, 1)  # (nh, L, D)
        out.append((torch.where(keep[s], probs / (1 - p), 0.0) @ vs).transpose(0, 1))  # (L, nh, D)
    return torch.cat(out)


def drawn_mask(kernel, q, k, cu, p, half_window, seed):
    """The kernel's keep mask for these shapes and this CUDA seed: with v[t] one-hot at t's position in its
    sequence, output[i, h, j] is the kept, rescaled probability of key j (0 where dropped).
    -> (keep, probed): lists of (nh, L, L)."""
    bounds = cu.tolist()
    v = torch.zeros_like(q)
    for a, b in zip(bounds[:-1], bounds[1:]):
        v[a:b, :, : b - a] = torch.eye(b - a, dtype=q.dtype, device=q.device)[:, None, :]
    torch.cuda.manual_seed(seed)
    probe = kernel(q, k, v, cu, max(LENGTHS), p, half_window).float()  # (N, nh, D)
    probed = [probe[a:b, :, : b - a].transpose(0, 1) for a, b in zip(bounds[:-1], bounds[1:])]
    return [x != 0 for x in probed], probed


def check_dropout_kernel(kernel, device, dtype, p, half_window):
    """The kernel's output and q/k/v gradients against the float32 reference with the mask it drew; the share
    of probabilities dropped within sampling error of p (~38k of them)."""
    q, k, v, cu = packed_qkv(device, dtype)
    keep, probed = drawn_mask(kernel, q, k, cu, p, half_window, seed=11)
    dropped = allowed = 0
    for kept, got, probs in zip(keep, probed, reference_probs(q, k, cu, half_window)):
        torch.testing.assert_close(got, torch.where(kept, probs / (1 - p), 0.0), atol=2e-3, rtol=1e-2)
        dropped += ((~kept) & (probs > 0)).sum().item()
        allowed += (probs > 0).sum().item()
    assert abs(dropped / allowed - p) < 0.01
    # the same seed draws the same mask for any values of v
    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
    torch.cuda.manual_seed(11)
    out = kernel(qg, kg, vg, cu, max(LENGTHS), p, half_window)
    grad = torch.randn_like(out)
    out.backward(grad)
    qr, kr, vr = (x.detach().float().requires_grad_() for x in (q, k, v))
    ref = reference(qr, kr, vr, cu, keep, p, half_window)
    ref.backward(grad.float())
    torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=1e-2)
    for got, want in ((qg.grad, qr.grad), (kg.grad, kr.grad), (vg.grad, vr.grad)):
        torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("half_window", [None, 8])
@pytest.mark.parametrize("p", [0.0, 0.1])
def test_varlen_kernel_dropout_is_exact_against_its_own_mask(cuda, p, half_window):
    if attn.VARLEN_KERNEL[0] != "torch":
        pytest.skip("this checks torch's kernels through model.flash_varlen (flash-attn is installed)")
    check_dropout_kernel(attn.flash_varlen, cuda, torch.float16, p, half_window)


def test_training_with_attention_dropout_runs_in_the_varlen_kernel(cuda):
    """BERT's recipe (attention dropout 0.1) on packed rows: the varlen kernel in training, not the masked
    SDPA fallback; the same CUDA seed gives the same loss, and the gradients are finite."""
    torch.manual_seed(0)
    model = build_model(tiny(attention_probs_dropout_prob=0.1), "pretraining", attention="auto").to(cuda).train()
    _, packed, _ = packed_and_padded()
    packed = {k: v.to(cuda) for k, v in packed.items()}
    calls = []
    real = attn.varlen
    attn.varlen = lambda *a, **k: calls.append(a[4]) or real(*a, **k)
    try:
        losses = []
        for _ in range(2):
            torch.cuda.manual_seed(5)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                losses.append(model(**packed).loss)
    finally:
        attn.varlen = real
    assert calls == [0.1] * 4  # two forwards x two layers, with the dropout rate
    torch.testing.assert_close(losses[0], losses[1], atol=0, rtol=0)
    losses[0].backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_segmented_layout_on_the_flash_kernel_eager_and_compiled(cuda):
    """Packed rows with the loader's bounds (`attention.segment_bounds`): the segmented layout (every token,
    fixed shapes) gives the unpadded path's outputs; compiled with fullgraph=True (one graph, the flash op opaque
    in it) it gives eager's loss and gradients."""
    torch.manual_seed(0)
    model = build_model(tiny(), "pretraining", attention="auto").to(cuda)
    _, packed, where = packed_and_padded()
    packed = {k: v.to(cuda) for k, v in packed.items()}
    cu = attn.segment_bounds(packed["attention_mask"].cpu()).to(cuda)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        model.eval()
        unpadded, segmented = model(**packed), model(**packed, cu_seqlens=cu)
    for r, off, n in where.values():
        a, b = (x.last_hidden_state[r, off : off + n].float() for x in (unpadded, segmented))
        torch.testing.assert_close(b, a, atol=3e-2, rtol=3e-2)
    model.train()
    runs = []
    for fn in (model, torch.compile(model, fullgraph=True)):
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fn(**packed, cu_seqlens=cu).loss
        loss.backward()
        runs.append((loss.detach().float(), [p.grad.float().clone() for p in model.parameters() if p.grad is not None]))
    (eager_loss, eager_grads), (compiled_loss, compiled_grads) = runs
    torch.testing.assert_close(compiled_loss, eager_loss, atol=2e-2, rtol=2e-2)
    for c, e in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(c, e, atol=5e-2, rtol=5e-2)


def test_heads_the_flash_kernel_does_not_take_keep_sdpa(cuda):
    """Head size 12 (not a multiple of 8): `auto` trains on the masked SDPA path instead of failing in flash."""
    model = build_model(tiny(hidden_size=48, attention_probs_dropout_prob=0.1), "pretraining").to(cuda).train()
    _, packed, _ = packed_and_padded()
    calls = []
    real = attn.varlen
    attn.varlen = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**{k: v.to(cuda) for k, v in packed.items()}).loss
    finally:
        attn.varlen = real
    loss.backward()
    assert not calls and torch.isfinite(loss)
