"""flops_per_sequence against hand counts."""

import pytest

from bertforge.model import BertConfig
from bertforge.model.flops import flops_per_sequence


def test_bert_base_pretraining_flops_by_hand():
    c = BertConfig.from_preset("base")
    T, H, I, V, P = 128, 768, 3072, 30522, 20
    layer = 2 * T * H * 3 * H + 4 * T * T * H + 2 * T * H * H + 4 * T * H * I
    fwd = 12 * layer + P * (2 * H * H + 2 * H * V) + 2 * H * H + 4 * H
    assert flops_per_sequence(c, T, P, training=False) == pytest.approx(fwd)
    assert flops_per_sequence(c, T, P) == pytest.approx(3 * fwd)
    # forward = 2·N·T (N = 12 layers x 12H² weights) plus attention's T² terms (T/6H = 3% here)
    assert 0.9 < 12 * layer / (2 * T * 12 * 12 * H * H) < 1.2


def test_heads_and_unknown_task():
    c = BertConfig.from_preset("tiny")
    enc = flops_per_sequence(c, 64, 0, task="mlm", training=False)
    assert flops_per_sequence(c, 64, 0, task="qa", training=False) == pytest.approx(enc + 2 * 64 * 128 * 2)
    assert flops_per_sequence(c, 64, 10, task="mlm") > flops_per_sequence(c, 64, 0, task="mlm")
    with pytest.raises(ValueError, match="unknown task"):
        flops_per_sequence(c, 64, task="nope")
