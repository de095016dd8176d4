"""The training step's fast paths on a CUDA GPU, each against its eager reference on the same inputs (marker
`gpu`; run on the device machine): the compiled step, and FP8 matmuls (torchao) against bf16."""

import pytest
import torch

from bertforge.bench.step import random_batches
from bertforge.model import BertConfig, build_model
from bertforge.optim.lamb import build_optimizer
from bertforge.runtime.step import TrainStep, train_step

pytestmark = pytest.mark.gpu


def _steps(
    compile: bool | str = False,
    use_fp8: bool = False,
    n: int = 4,
    optim_compile: bool = False,
    scope: str = "model",
    accum: int = 1,
    low_precision_norms: bool = False,
) -> list[float]:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    d = torch.device("cuda")
    torch.manual_seed(0)
    cfg = BertConfig.from_preset("mini", vocab_size=30528, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = build_model(cfg, "pretraining", attention="sdpa").to(d)
    if low_precision_norms:
        from bertforge.runtime.norms import apply_low_precision_layernorm

        apply_low_precision_layernorm(model)
    if use_fp8:
        from bertforge.runtime import fp8

        assert fp8.fp8_usable(d) and fp8.convert(model) > 0
    opt = build_optimizer(model, "lamb", 1e-3, 0.01, (0.9, 0.999), 1e-6, "cuda", compile=optim_compile)
    step = TrainStep.build(model, opt, d, "bf16", 1.0, compile, compile_scope=scope)
    batches = random_batches(32, 128, 20, 30522, n=n)
    return [train_step(step, batches[i : i + accum], accum).loss.item() for i in range(0, n, accum)]


def test_compiled_step_tracks_eager():
    eager, compiled = _steps(), _steps(compile=True)
    assert all(abs(a - b) < 0.02 * a for a, b in zip(eager, compiled)), (eager, compiled)


def test_cuda_graphs_step_tracks_eager():
    """train.cuda_graphs: the compiled step replayed from CUDA graphs ("reduce-overhead")."""
    eager, graphs = _steps(n=6), _steps(compile="reduce-overhead", n=6)
    assert all(abs(a - b) < 0.02 * a for a, b in zip(eager, graphs)), (eager, graphs)


def test_layer_by_layer_cuda_graphs_track_eager():
    """train.compile_scope=layers with train.cuda_graphs: each layer's compiled graph replayed from CUDA graphs,
    the embeddings, heads and loss eager between them."""
    eager, graphs = _steps(n=6), _steps(compile="reduce-overhead", n=6, scope="layers")
    assert all(abs(a - b) < 0.02 * a for a, b in zip(eager, graphs)), (eager, graphs)


@pytest.mark.parametrize("scope", ["model", "layers"])
def test_accumulation_under_cuda_graphs_tracks_eager(scope):
    """Three micro-batches per update replayed from CUDA graphs: every micro-batch's gradient counts (the first
    one's leaves the graphs' pool before the next replay, runtime.step._grads_out_of_the_graph_pool)."""
    eager, graphs = _steps(n=12, accum=3), _steps(compile="reduce-overhead", n=12, accum=3, scope=scope)
    assert all(abs(a - b) < 0.02 * a for a, b in zip(eager, graphs)), (eager, graphs)


def test_low_precision_layernorm_tracks_fp32_norms_eager_and_under_cuda_graphs():
    """train.low_precision_layernorm on CUDA, where autocast would run LayerNorm in fp32: bf16 norms and residual
    stream, eager and compiled with CUDA graphs, against the fp32-norm eager step."""
    reference = _steps(n=6)
    eager, graphs = (
        _steps(n=6, low_precision_norms=True),
        _steps(compile="reduce-overhead", n=6, low_precision_norms=True),
    )
    assert all(abs(a - b) < 0.02 * a for a, b in zip(reference, eager)), (reference, eager)
    assert all(abs(a - b) < 0.02 * a for a, b in zip(reference, graphs)), (reference, graphs)


def test_compiled_lamb_tracks_the_foreach_update_on_cuda():
    """optim.compile on CUDA: the same losses step by step as the foreach update."""
    foreach, compiled = _steps(n=6), _steps(n=6, optim_compile=True)
    assert all(abs(a - b) < 0.01 * a for a, b in zip(foreach, compiled)), (foreach, compiled)


def test_step_parts_add_up_to_the_steps_wall_time_on_cuda():
    """StepTimeline's CUDA events: the parts of the counted updates add up to their wall time (the host waits
    for each update's end at the next update's grad-norm sync, so the device timeline is the wall clock)."""
    import time

    from bertforge.runtime.profile import StepTimeline

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    d = torch.device("cuda")
    model = build_model(BertConfig.from_preset("mini", vocab_size=30528), "pretraining", attention="sdpa").to(d)
    opt = build_optimizer(model, "lamb", 1e-3, 0.01, (0.9, 0.999), 1e-6, "cuda")
    step = TrainStep.build(model, opt, d, "bf16", 1.0)
    step.timeline = StepTimeline(d)
    batches = random_batches(64, 128, 20, 30522, n=2)
    train_step(step, [batches[0]], 1)  # warm-up: not counted
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(5):
        train_step(step, [batches[i % 2]], 1)
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3 / 5
    parts = step.timeline.summary(skip=1)
    total = sum(v["ms"] for v in parts.values())
    assert parts["forward"]["ms"] > 0 and parts["backward"]["ms"] > parts["optimizer"]["ms"] > 0
    assert abs(total - wall_ms) < 0.1 * wall_ms, (parts, wall_ms)


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
