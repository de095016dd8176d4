"""The training step's fast paths on a CUDA GPU, each against its eager reference on the same inputs (marker
`gpu`; run on the device machine): the compiled step, and FP8 matmuls (torchao) against bf16."""

import pytest
import torch

from bertforge.bench.step import random_batches
from bertforge.model import BertConfig, build_model
from bertforge.optim.lamb import build_optimizer
from bertforge.runtime.step import TrainStep, train_step

pytestmark = pytest.mark.gpu


def _steps(compile: bool | str = False, use_fp8: bool = False, n: int = 4) -> list[float]:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    d = torch.device("cuda")
    torch.manual_seed(0)
    cfg = BertConfig.from_preset("mini", vocab_size=30528, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = build_model(cfg, "pretraining", attention="sdpa").to(d)
    if use_fp8:
        from bertforge.runtime import fp8

        assert fp8.fp8_usable(d) and fp8.convert(model) > 0
    opt = build_optimizer(model, "lamb", 1e-3, 0.01, (0.9, 0.999), 1e-6, "cuda")
    step = TrainStep.build(model, opt, d, "bf16", 1.0, compile)
    return [train_step(step, [b], 1).loss.item() for b in random_batches(32, 128, 20, 30522, n=n)]


def test_compiled_step_tracks_eager():
    eager, compiled = _steps(), _steps(compile=True)
    assert all(abs(a - b) < 0.02 * a for a, b in zip(eager, compiled)), (eager, compiled)


def test_fp8_step_tracks_bf16():
    pytest.importorskip("torchao.float8")
    bf16, f8 = _steps(), _steps(use_fp8=True)
    assert all(abs(a - b) < 0.03 * a for a, b in zip(bf16, f8)), (bf16, f8)


def test_loaders_pin_batches_for_the_gpu(tmp_path):
    """With pin_memory set (the loop sets it on CUDA) batches arrive page-locked, with workers and without."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from bertforge.data.synthetic import SyntheticLoader

    for workers in (0, 2):
        loader = SyntheticLoader(128, 20, 30522, 8, 8, 0, 1, 0, num_workers=workers)
        loader.pin_memory = True
        assert all(t.is_pinned() for t in next(loader.iterate()).values())
