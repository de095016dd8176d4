"""FP8 (torchao float8, emulated on the CPU): conversion keeps Parameters and state_dict keys, the converted
model tracks the bf16 one, `revert` restores plain linears, and the guard falls back once after N in a row."""

import pytest
import torch

from bertforge.model import BertConfig, build_model
from bertforge.runtime import fp8

pytest.importorskip("torchao.float8")


def _model():
    torch.manual_seed(0)
    cfg = BertConfig.from_preset("mini", vocab_size=512, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return build_model(cfg, "pretraining", attention="eager")


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 512, (4, 32), generator=g)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "token_type_ids": torch.zeros_like(ids),
        "masked_positions": torch.tensor([[1, 5, 9]] * 4),
        "masked_labels": torch.randint(5, 512, (4, 3), generator=g),
        "nsp_labels": torch.tensor([0, 1, 0, 1]),
    }


def test_convert_keeps_parameters_and_tracks_the_reference():
    model = _model()
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    params = [id(p) for p in model.parameters()]
    with torch.no_grad():
        want = model(**_batch()).loss
    n = fp8.convert(model, emulate=True)
    assert n == 4 * 4 + 2  # qkv, attention out, intermediate, output per layer (4 layers); pooler, MLM transform
    assert [id(p) for p in model.parameters()] == params and model.state_dict().keys() == ref.keys()
    assert not any(
        "seq_relationship" in name and type(m).__name__ == "Float8Linear" for name, m in model.named_modules()
    )
    out = model(**_batch())
    out.loss.backward()
    assert torch.isfinite(out.loss) and abs(out.loss.item() - want.item()) < 0.05 * want.item()
    assert fp8.revert(model) == n
    assert not any(type(m).__name__ == "Float8Linear" for m in model.modules())
    assert [id(p) for p in model.parameters()] == params
    with torch.no_grad():
        assert torch.allclose(model(**_batch()).loss, want)


def test_guard_falls_back_once_after_n_in_a_row():
    g = fp8.Fp8Guard(fallback_after=3)
    assert [g.observe(f) for f in (False, False, True, False, False)] == [False] * 5
    assert g.observe(False) is True and g.observe(False) is False and not g.active


def test_loop_trains_in_fp8_and_falls_back(shards, tmp_path, overrides, monkeypatch):
    """`train.fp8` in the real loop (emulated casts on the CPU): it trains, and when the guard fires the model
    is back on plain linears for the rest of the run, with the fallback logged."""
    from bertforge import config as C
    from bertforge.runtime.metrics import read_jsonl
    from bertforge.train import loop

    fired = iter([False, True])
    monkeypatch.setattr(fp8.Fp8Guard, "observe", lambda self, finite: next(fired, False))
    seen = {}
    real_setup = loop.setup

    def setup(*a, **k):
        run = real_setup(*a, **k)
        seen["run"] = run
        seen["converted"] = sum(type(m).__name__ == "Float8Linear" for m in run.model.modules())
        return run

    monkeypatch.setattr(loop, "setup", setup)
    cfg = C.load_config(
        "pretrain",
        "demo_tiny_128",
        overrides(
            shards,
            tmp_path / "run",
            **{
                "model.preset": "mini",
                "train.fp8": True,
                "train.fp8_emulate": True,
                "train.precision": "bf16",
                "train.max_steps": 3,
            },
        ),
    )
    summary = loop.run_pretrain(cfg)
    assert seen["converted"] == 18 and summary["step"] == 3
    assert not any(type(m).__name__ == "Float8Linear" for m in seen["run"].model.modules())
    assert any(r.get("fp8_fallback") == 1.0 for r in read_jsonl(tmp_path / "run" / "metrics.jsonl"))


def _fp8_config(shards, out, overrides, **extra):
    from bertforge import config as C

    sets = {"model.preset": "mini", "train.fp8": True, "train.fp8_emulate": True, "train.precision": "bf16", **extra}
    return C.load_config("pretrain", "demo_tiny_128", overrides(shards, out, **sets))


def _float8_layers(model) -> int:
    return sum(type(m).__name__ == "Float8Linear" for m in model.modules())


def test_a_fall_back_to_bf16_holds_across_resume(shards, tmp_path, overrides, monkeypatch):
    """FP8 falls "back to bf16 for the rest of the run": a resumed run used to convert the layers again."""
    from bertforge.train import loop

    fired = iter([True])  # the guard fires on the first update
    monkeypatch.setattr(fp8.Fp8Guard, "observe", lambda self, finite: next(fired, False))
    runs = []
    real_setup = loop.setup
    monkeypatch.setattr(loop, "setup", lambda *a, **k: runs.append(real_setup(*a, **k)) or runs[-1])
    extra = {"train.max_steps": 4, "train.save_every": 2}
    loop.run_pretrain(_fp8_config(shards, tmp_path / "run", overrides, **extra, **{"train.stop_after_steps": 2}))
    assert _float8_layers(runs[0].model) == 0
    summary = loop.run_pretrain(_fp8_config(shards, tmp_path / "run", overrides, **extra), resume=True)
    assert summary["step"] == 4 and _float8_layers(runs[1].model) == 0 and runs[1].fp8_guard is None


def test_after_the_fall_back_bf16_gets_its_own_non_finite_tries(shards, tmp_path, overrides, monkeypatch):
    """FP8's bad steps used to count against bf16: with max_nonfinite_steps = fp8_fallback_after the run said
    "back to bf16" and stopped in the same update."""
    from bertforge.train import loop

    calls = []
    real = loop.train_step

    def overflowing_three_times(step, batches, accum, observe=None, weights=None):
        calls.append(1)
        return real(step, batches, accum, observe, weights=[float("nan")] * accum if len(calls) <= 3 else None)

    monkeypatch.setattr(loop, "train_step", overflowing_three_times)
    extra = {"train.max_steps": 2, "train.save_every": 0, "train.fp8_fallback_after": 3, "train.max_nonfinite_steps": 3}
    summary = loop.run_pretrain(_fp8_config(shards, tmp_path / "run", overrides, **extra))
    assert summary["step"] == 2 and summary["skipped_steps"] == 3


def test_a_token_count_scaled_mm_cannot_take_is_refused_at_start(tmp_path, overrides, monkeypatch):
    """micro-batch x seq_len rows not in multiples of 16 (3 x 30 here) stopped an H100 run in its first backward
    (torch._scaled_mm's weight gradient); it is one line at start-up."""
    from tests.train.conftest import make_shards

    from bertforge.errors import UserError
    from bertforge.train import loop

    monkeypatch.setattr(fp8, "fp8_usable", lambda device: True)  # an FP8 GPU, as far as the checks go
    shards = make_shards(tmp_path / "s30", seq_len=30)
    sets = {"train.fp8_emulate": False, "train.micro_batch_size": 3, "train.global_batch_size": 6}
    with pytest.raises(UserError, match=r"train.fp8 needs train.micro_batch_size x the rows' seq_len .* not 3 x 30"):
        loop.run_pretrain(_fp8_config(shards, tmp_path / "run", overrides, **sets))
