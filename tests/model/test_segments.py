"""The segmented layout (`attention.segment_bounds`): every token of the batch in one (B*T, H) stream, attention
within the segments that the loader computes on the host — fixed shapes for the CUDA flash kernel, so a compiled
step is one graph. Checked here without a GPU, with a traceable reference standing in for the flash kernel: the
bounds themselves, the same outputs as padded SDPA at every real token (BERT packed and padded rows, ModernBERT's
window and rotary positions), a compiled forward and backward with no graph break, and the loaders' batches.
The kernel itself: test_gpu_varlen.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertforge.data.loader import batch_stream
from bertforge.data.synthetic import SyntheticLoader, _SyntheticStream
from bertforge.model import BertConfig, build_model
from bertforge.model import attention as attn
from bertforge.runtime.step import wants_segments

from .test_model import packed_and_padded, tiny


def test_segment_bounds_cover_every_token_in_runs_then_empty_segments_to_a_multiple_of_rows():
    mask = torch.tensor([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]])
    cu = attn.segment_bounds(mask)
    # row 0: [1 1][2 2 2][0]; row 1: one sequence; row 2: padding only -> 5 segments, rounded up to 6 = 2 x 3
    assert cu.tolist() == [0, 2, 5, 6, 12, 18, 18] and cu.dtype == torch.int32
    assert attn.segment_bounds(torch.ones(4, 3, dtype=torch.long)).tolist() == [0, 3, 6, 9, 12]


def test_segmented_layout_matches_padded_sdpa(flash_stand_in):
    torch.manual_seed(0)
    model = build_model(tiny(), "pretraining", attention="auto").eval()
    reference = build_model(tiny(), "pretraining", attention="sdpa").eval()
    reference.load_state_dict(model.state_dict())
    padded, packed, where = packed_and_padded()
    want = reference(**padded)
    for batch in (padded, packed):
        got = model(**batch, cu_seqlens=attn.segment_bounds(batch["attention_mask"]))
        torch.testing.assert_close(got.loss, want.loss, atol=1e-5, rtol=0)
    for i, (r, off, n) in where.items():  # the packed batch's sequences against the padded rows
        torch.testing.assert_close(
            got.last_hidden_state[r, off : off + n], want.last_hidden_state[i, :n], atol=1e-5, rtol=0
        )
    assert len(flash_stand_in) == 4 and all(indices is None for _, indices, _ in flash_stand_in)  # no gather
    # explicit `varlen` keeps unpadding: the bounds are not used
    model.bert.attention_impl = "varlen"
    model(**packed, cu_seqlens=attn.segment_bounds(packed["attention_mask"]))
    assert flash_stand_in[-1][1] is not None


def test_modernbert_segmented_with_window_and_rotary_positions(flash_stand_in):
    config = BertConfig.from_preset("modernbert-tiny", vocab_size=97, local_attention=8)
    torch.manual_seed(0)
    model = build_model(config, "mlm", attention="auto").eval()
    reference = build_model(config, "mlm", attention="sdpa").eval()
    reference.load_state_dict(model.state_dict())
    ids = torch.randint(3, 97, (3, 24))
    mask = (torch.arange(24)[None] < torch.tensor([24, 17, 5])[:, None]).long()
    with torch.no_grad():
        want = reference(ids, mask).last_hidden_state
        got = model(ids, mask, cu_seqlens=attn.segment_bounds(mask)).last_hidden_state
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-5, rtol=0)
    assert [(w, indices) for _, indices, w in flash_stand_in] == [(None, None), (4, None), (4, None), (None, None)]


def test_segmented_step_compiles_to_one_graph(flash_stand_in):
    """Fixed shapes: forward, loss and backward trace with fullgraph=True (no nonzero, no host sync)."""
    torch.manual_seed(0)
    model = build_model(tiny(), "pretraining", attention="auto")
    _, packed, _ = packed_and_padded()
    cu = attn.segment_bounds(packed["attention_mask"])
    eager = model(**packed, cu_seqlens=cu).loss
    eager.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    loss = compiled(**packed, cu_seqlens=cu).loss
    loss.backward()
    torch.testing.assert_close(loss, eager, atol=1e-6, rtol=0)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("workers", [0, 1])
def test_loader_batches_carry_the_bounds_when_asked(workers):
    loader = SyntheticLoader(128, 20, 1000, 8, 8, 0, 1, seed=3, pack=3, num_workers=workers)
    plain = next(loader.iterate())
    assert "cu_seqlens" not in plain
    batch = next(batch_stream(_SyntheticStream(loader, 0), workers, 2, 3, segments=True))
    torch.testing.assert_close(batch["input_ids"], plain["input_ids"])
    assert torch.equal(batch["cu_seqlens"], attn.segment_bounds(batch["attention_mask"]))
    loader.segments = True
    assert torch.equal(next(loader.iterate())["cu_seqlens"], batch["cu_seqlens"])


def test_runs_ask_for_bounds_for_packed_or_fixed_shape_flash_steps():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert wants_segments(cuda, "auto", packed=True, fixed=False)
    assert wants_segments(cuda, "auto", packed=False, fixed=True)  # compiled, or FP8
    assert not wants_segments(cuda, "auto", packed=False, fixed=False)  # unpadding computes no padding at all
    assert not wants_segments(cpu, "auto", packed=True, fixed=True)
    assert not wants_segments(cuda, "varlen", packed=True, fixed=True)  # asked for unpadding
    assert not wants_segments(cuda, "sdpa", packed=True, fixed=True)


def test_fine_tuning_batches_carry_the_bounds_when_asked():
    from bertforge.finetune.runner import Encoded, collate

    ids = [np.array([2, 5, 6, 3]), np.array([2, 7, 3])]
    data = Encoded(input_ids=ids, token_type_ids=[np.zeros_like(x) for x in ids], targets={})
    plain = collate(data, [0, 1], 0, torch.device("cpu"), targets=False)
    batch = collate(data, [0, 1], 0, torch.device("cpu"), targets=False, segments=True)
    assert "cu_seqlens" not in plain and batch["cu_seqlens"].tolist() == [0, 4, 7, 8, 8]
