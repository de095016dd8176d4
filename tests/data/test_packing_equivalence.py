"""The key correctness test of packing (DESIGN §3.3, §5.5): the same sequences give the same loss and the same
gradient of every parameter whether they are fed unpacked (one per row) or packed (several per row)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertforge.data import packing_rows as pr
from bertforge.model import BertConfig, build_model

S, P, V = 48, 8, 97


def samples(lengths, seed=0):
    """Unpacked NVIDIA-schema rows: [CLS]=1 at 0, random tokens, two segments, masked slots, NSP labels."""
    rng = np.random.default_rng(seed)
    n = len(lengths)
    lengths = np.asarray(lengths)
    col = np.arange(S)[None, :]
    real = col < lengths[:, None]
    ids = np.where(real, rng.integers(5, V, (n, S)), 0).astype(np.int32)
    ids[:, 0] = 1
    seg = (real & (col > (lengths // 2)[:, None])).astype(np.int8)
    pos = np.zeros((n, P), np.int32)
    for i, length in enumerate(lengths):
        k = min(P, max(1, round(0.15 * length)), length - 1)
        pos[i, :k] = np.sort(rng.choice(np.arange(1, length), k, replace=False))
    labels = np.where(pos != 0, rng.integers(5, V, (n, P)), 0).astype(np.int32)
    return {
        "input_ids": ids,
        "input_mask": real.astype(np.int8),
        "segment_ids": seg,
        "masked_lm_positions": pos,
        "masked_lm_ids": labels,
        "next_sentence_labels": rng.integers(0, 2, n).astype(np.int8),
    }


def loss_and_grads(model, inputs):
    model.zero_grad(set_to_none=True)
    out = model(**inputs)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


def model_for(attention):
    torch.manual_seed(0)
    cfg = BertConfig.from_preset(
        "tiny", vocab_size=V, max_position_embeddings=S, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    return build_model(cfg, "pretraining", attention=attention).float()


CASES = {
    # K = 1: one sequence per row (the packed format with nothing packed), rows end in padding
    "k1": ([20, 48, 7], [[0], [1], [2]]),
    # K = 2: a full row (30 + 18 = 48) and a row that ends in padding with an empty second slot
    "k2": ([30, 18, 25], [[0, 1], [2, -1]]),
    # K = 3: a full row, a row of 3 that ends in padding, a row with one sequence and two empty slots
    "k3": ([20, 16, 12, 10, 9, 8, 40], [[0, 1, 2], [3, 4, 5], [6, -1, -1]]),
}


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("case", list(CASES))
def test_packed_equals_unpacked(case, attention):
    lengths, packs = CASES[case]
    s = samples(lengths, seed=len(lengths))
    packs = np.array(packs)
    rows = pr.build_packed_rows(s, packs)
    assert (rows["input_mask"][:, -1] == 0).any()  # some pack ends in padding
    model = model_for(attention)
    ref, ref_g = loss_and_grads(model, pr.unpacked_model_inputs(s))
    got, got_g = loss_and_grads(model, pr.packed_model_inputs(rows))
    assert int(got.mlm_count) == int(ref.mlm_count) and int(got.nsp_count) == int(ref.nsp_count) == len(lengths)
    torch.testing.assert_close(got.loss, ref.loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.mlm_loss, ref.mlm_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.nsp_loss, ref.nsp_loss, atol=1e-5, rtol=1e-5)
    assert set(got_g) == set(ref_g) and len(ref_g) == len(list(model.parameters()))
    for name in ref_g:
        torch.testing.assert_close(
            got_g[name], ref_g[name], atol=1e-5, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}"
        )


@pytest.mark.parametrize("algorithm", ["spfhp", "lpfhp", "nnlshp"])
def test_packed_equals_unpacked_through_the_algorithms(algorithm):
    rng = np.random.default_rng(3)
    s = samples(rng.integers(3, S + 1, 24), seed=5)
    rows = pr.pack_samples(s, max_per_pack=3, algorithm=algorithm, rng=np.random.default_rng(1))
    assert len(rows["input_ids"]) < 24
    model = model_for("sdpa")
    ref, ref_g = loss_and_grads(model, pr.unpacked_model_inputs(s))
    got, got_g = loss_and_grads(model, pr.packed_model_inputs(rows))
    torch.testing.assert_close(got.loss, ref.loss, atol=1e-5, rtol=1e-5)
    for name in ref_g:
        torch.testing.assert_close(
            got_g[name], ref_g[name], atol=1e-5, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}"
        )


def test_cross_contamination_would_be_caught():
    """Sanity of the test itself: without the sequence index (all real tokens in one block) the loss differs."""
    lengths, packs = CASES["k3"]
    s = samples(lengths, seed=len(lengths))
    rows = pr.build_packed_rows(s, np.array(packs))
    model = model_for("sdpa")
    ref, _ = loss_and_grads(model, pr.unpacked_model_inputs(s))
    leaky = pr.packed_model_inputs(rows)
    leaky["attention_mask"] = (leaky["attention_mask"] > 0).long()
    bad, _ = loss_and_grads(model, leaky)
    assert not torch.allclose(bad.loss, ref.loss, atol=1e-4)


def test_packed_equals_unpacked_bf16_autocast():
    """bf16 (the GPU default) agrees loosely: the same maths, rounded differently."""
    lengths, packs = CASES["k3"]
    s = samples(lengths, seed=len(lengths))
    rows = pr.build_packed_rows(s, np.array(packs))
    model = model_for("sdpa")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = model(**pr.unpacked_model_inputs(s)).loss
        got = model(**pr.packed_model_inputs(rows)).loss
    torch.testing.assert_close(got.float(), ref.float(), atol=0.05, rtol=0.02)
