"""The variable-length path on CUDA (flash-attn varlen or torch's varlen_attn): no padding compute, same
per-sequence outputs and loss as the padded SDPA path. Needs a CUDA device (marker gpu)."""

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
        pytest.skip("no varlen flash kernel (flash-attn or torch.nn.attention.varlen)")
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
