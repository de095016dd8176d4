"""Audit of the training step's guardrails and fast paths on the CPU: FP8 (torchao float8) on the shapes CUDA's
FP8 matmul accepts, a skipped (non-finite) update leaves no trace in the next one, and the compiled step
(accumulation, clipping, packed and padded rows) against the eager step."""

from __future__ import annotations

import pytest
import torch

from bertforge.model import BertConfig, build_model
from bertforge.optim.lamb import build_optimizer
from bertforge.runtime import fp8
from bertforge.runtime.step import TrainStep, train_step

V = 128


def _tiny() -> BertConfig:
    return BertConfig(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def _batches(n: int, packed: bool, B: int = 4, T: int = 16) -> list[dict[str, torch.Tensor]]:
    """Padded rows (one shorter row), or packed rows of two sequences (9 + 5 tokens, 2 of padding)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(5, V, (B, T), generator=g)
        if packed:
            mask = torch.tensor([1] * 9 + [2] * 5 + [0] * 2).expand(B, T).clone()
            positions = torch.cat([torch.arange(9), torch.arange(5), torch.zeros(2, dtype=torch.long)])
            slots = torch.tensor([[1, 3, 10, 12, 0]] * B)
            extra = {"position_ids": positions.expand(B, T).clone(), "nsp_positions": torch.tensor([[0, 9]] * B)}
            nsp = torch.randint(0, 2, (B, 2), generator=g)
        else:
            mask = torch.ones(B, T, dtype=torch.long)
            mask[0, 12:] = 0
            slots, extra, nsp = torch.tensor([[1, 3, 5, 0]] * B), {}, torch.randint(0, 2, (B,), generator=g)
        labels = torch.randint(5, V, slots.shape, generator=g) * (slots > 0)
        out.append(
            {
                "input_ids": ids * (mask > 0),
                "attention_mask": mask,
                "token_type_ids": torch.zeros_like(ids),
                "masked_positions": slots,
                "masked_labels": labels,
                "nsp_labels": nsp,
                **extra,
            }
        )
    return out


def _run(updates: list[list[dict]], accum: int, compile: bool = False, precision: str = "fp32", poison=()):
    """LAMB updates over `updates` (accum micro-batches each) with clipping at 0.05 (every update clips); the
    updates numbered in `poison` get a NaN loss weight on their first micro-batch. Returns the losses, the model's
    state and the optimizer's."""
    torch.manual_seed(0)
    model = build_model(_tiny(), "pretraining", attention="sdpa")
    optimizer = build_optimizer(model, "lamb", 1e-2, 0.01, (0.9, 0.999), 1e-6, "cpu")
    step = TrainStep.build(model, optimizer, torch.device("cpu"), precision, 0.05, compile)
    results = []
    for i, micro in enumerate(updates):
        weights = [float("nan")] + [1 / accum] * (accum - 1) if i in poison else None
        results.append(train_step(step, micro, accum, weights=weights))
        if i in poison:
            assert not results[-1].finite and all(p.grad is None for p in model.parameters())
    return results, model.state_dict(), optimizer.state_dict()


def _cuda_scaled_mm_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch._scaled_mm as CUDA runs it (the CPU kernel takes any shape): the first operand's inner dimension and
    both of the second's in multiples of 16, else the same RuntimeError as on an H100."""
    real = torch._scaled_mm

    def scaled_mm(a, b, *args, **kwargs):
        if a.shape[1] % 16 or b.shape[0] % 16 or b.shape[1] % 16:
            raise RuntimeError(f"Expected trailing dimension of mat1 to be divisible by 16 ({a.shape} @ {b.shape})")
        return real(a, b, *args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)


def test_fp8_trains_on_a_micro_batch_of_8_as_pretrain_large_512_does(monkeypatch):
    """The pooler sees one row per sequence: a micro-batch of 8 gave its weight gradient's FP8 matmul an inner
    dimension of 8, which CUDA's _scaled_mm refuses; the MLM transform's masked slots likewise (8 x 5 here)."""
    pytest.importorskip("torchao.float8")
    _cuda_scaled_mm_rules(monkeypatch)
    monkeypatch.setattr(fp8, "MIN_WIDTH", 32)  # a 32-wide model converts as a 256-wide one (CPU FP8 is slow)
    torch.manual_seed(0)
    cfg = _tiny()
    model = build_model(cfg, "pretraining", attention="eager")
    reference = build_model(cfg, "pretraining", attention="eager")
    reference.load_state_dict(model.state_dict())
    assert fp8.convert(model, emulate=False) == 2 * 4 + 2  # 4 per layer; pooler, MLM transform
    B, T = 8, 16
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, V, (B, T), generator=g)
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "token_type_ids": torch.zeros_like(ids),
        "masked_positions": torch.tensor([[1, 3, 5, 8, 13]] * B),
        "masked_labels": torch.randint(5, V, (B, 5), generator=g),
        "nsp_labels": torch.randint(0, 2, (B,), generator=g),
    }
    for m in (model, reference):
        with torch.autocast("cpu", torch.bfloat16):
            m(**batch).loss.backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        # FP8 against bf16: the same gradient to within e4m3/e5m2 rounding
        cos = torch.nn.functional.cosine_similarity(p.grad.flatten().float(), q.grad.flatten().float(), dim=0)
        assert cos > 0.95, (name, cos)


@pytest.mark.parametrize("accum", [1, 2])
def test_a_skipped_update_leaves_weights_optimizer_and_next_update_as_without_it(accum):
    """A non-finite update (DESIGN §6): no weight, moment or LAMB step count moves, its gradients are cleared,
    and the updates around it are the run without it, bit for bit."""
    padded = _batches(2 * accum, packed=False)
    a, b, c = padded[:accum], padded[accum:], _batches(accum, packed=True)
    skipped, w_skip, o_skip = _run([a, b, c], accum, poison={1})
    plain, w_plain, o_plain = _run([a, c], accum)
    assert [r.finite for r in skipped] == [True, False, True]
    assert [r.loss.item() for r in (skipped[0], skipped[2])] == [r.loss.item() for r in plain]
    for k in w_plain:
        assert torch.equal(w_skip[k], w_plain[k]), k
    assert o_skip["state"].keys() == o_plain["state"].keys()
    for i, s in o_plain["state"].items():
        for k, v in s.items():
            assert torch.equal(torch.as_tensor(o_skip["state"][i][k]), torch.as_tensor(v)), (i, k)


@pytest.mark.slow  # inductor compiles the tiny model's forward and backward on the CPU: ~1 min per case
@pytest.mark.parametrize(("accum", "packed"), [(2, False), (4, True)])
def test_the_compiled_step_gives_the_eager_updates(accum, packed):
    updates = _batches(3 * accum, packed)
    updates = [updates[i : i + accum] for i in range(0, 3 * accum, accum)]
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # inductor's CPU kernels otherwise sum in a varying order
    try:
        eager, w_eager, _ = _run(updates, accum)
        compiled, w_compiled, _ = _run(updates, accum, compile=True)
    finally:
        torch.use_deterministic_algorithms(was)
    for e, c in zip(eager, compiled):
        torch.testing.assert_close(c.loss, e.loss, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(c.grad_norm, e.grad_norm, rtol=1e-5, atol=1e-6)
    for k in w_eager:
        torch.testing.assert_close(w_compiled[k], w_eager[k], rtol=1e-5, atol=1e-6)
