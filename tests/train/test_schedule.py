"""Schedules against tables of hand-computed values (DESIGN §3.5), including the phase-2 offset."""

import pytest

from bertforge.optim.schedule import lr_at, phase_step

# (step, base_lr, max_steps, warmup, kind, expected) — expected written out as the arithmetic by hand
TABLE = [
    # poly: warmup 10% of 1000 steps
    (1, 6e-3, 1000, 0.1, "poly", 6e-3 * 0.001 / 0.1),
    (50, 6e-3, 1000, 0.1, "poly", 3e-3),
    (99, 6e-3, 1000, 0.1, "poly", 6e-3 * 0.099 / 0.1),
    (100, 6e-3, 1000, 0.1, "poly", 6e-3 * 0.9486832980505138),  # sqrt(0.9)
    (500, 6e-3, 1000, 0.1, "poly", 6e-3 * 0.7071067811865476),  # sqrt(0.5)
    (1000, 6e-3, 1000, 0.1, "poly", 0.0),
    # NVIDIA phase 1: lr 6e-3, warmup 0.2843, 7038 steps; warmup ends between step 2000 and 2001
    (2000, 6e-3, 7038, 0.2843, "poly", 6e-3 * (2000 / 7038) / 0.2843),
    (2001, 6e-3, 7038, 0.2843, "poly", 6e-3 * (1 - 2001 / 7038) ** 0.5),
    (7038, 6e-3, 7038, 0.2843, "poly", 0.0),
    # NVIDIA phase 2: lr 4e-3, warmup 0.128, 1563 steps
    (100, 4e-3, 1563, 0.128, "poly", 4e-3 * 100 / 200.064),
    (201, 4e-3, 1563, 0.128, "poly", 4e-3 * (1362 / 1563) ** 0.5),
    # linear (Hugging Face): 10 warmup steps of 100; update n runs at HF's step n - 1
    (1, 1e-4, 100, 0.1, "linear", 0.0),
    (6, 1e-4, 100, 0.1, "linear", 5e-5),
    (11, 1e-4, 100, 0.1, "linear", 1e-4),
    (56, 1e-4, 100, 0.1, "linear", 1e-4 * 45 / 90),
    (100, 1e-4, 100, 0.1, "linear", 1e-4 / 90),
    (1, 1e-4, 100, 0.0, "linear", 1e-4),
]


@pytest.mark.parametrize("step,base,max_steps,warmup,kind,expected", TABLE)
def test_table(step, base, max_steps, warmup, kind, expected):
    assert lr_at(step, base, max_steps, warmup, kind) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_phase2_offset():
    # phase 2 after 7038 phase-1 steps: run-wide step 7138 is phase-2 step 100, on phase 2's own schedule
    local = phase_step(7038 + 100, phase_offset=7038)
    assert local == 100
    assert lr_at(local, 4e-3, 1563, 0.128) == pytest.approx(4e-3 * 100 / 200.064, rel=1e-12)
    # the phase-1 schedule at that run-wide step would be a different (decayed) value
    assert lr_at(7138, 6e-3, 7038, 0.2843) == 0.0
    with pytest.raises(ValueError):
        phase_step(5, phase_offset=7038)


def test_unknown_schedule():
    with pytest.raises(ValueError, match="poly"):
        lr_at(1, 1e-3, 10, 0.1, "cosine")


# wsd: (step, max_steps, warmup, decay, shape, expected / base) — 100 steps, 10 warmup, decay over the last 20
WSD_TABLE = [
    (5, 100, 0.1, 0.2, "linear", 0.5),  # warmup: 5/10
    (10, 100, 0.1, 0.2, "linear", 1.0),  # warmup done
    (50, 100, 0.1, 0.2, "linear", 1.0),  # stable
    (80, 100, 0.1, 0.2, "linear", 1.0),  # the last stable step: the decay starts after step 80
    (85, 100, 0.1, 0.2, "linear", 0.75),  # 5/20 of the decay: 1 - 0.25
    (90, 100, 0.1, 0.2, "linear", 0.5),
    (100, 100, 0.1, 0.2, "linear", 0.0),
    (85, 100, 0.1, 0.2, "1-sqrt", 0.5),  # 1 - sqrt(0.25)
    (96, 100, 0.1, 0.2, "1-sqrt", 1 - 0.8**0.5),
    (99, 100, 0.1, 0.2, "1-sqrt", 1 - 0.95**0.5),
    (100, 100, 0.1, 0.2, "1-sqrt", 0.0),
    (100, 100, 0.1, 0.0, "linear", 1.0),  # no decay: warmup then constant (WSD's continuable "stable" phase)
    (1, 100, 0.0, 1.0, "linear", 0.99),  # no warmup, all decay: the linear schedule without warmup
]


@pytest.mark.parametrize("step,max_steps,warmup,decay,shape,expected", WSD_TABLE)
def test_wsd_table(step, max_steps, warmup, decay, shape, expected):
    lr = lr_at(step, 2e-3, max_steps, warmup, "wsd", decay=decay, decay_shape=shape)
    assert lr == pytest.approx(2e-3 * expected, rel=1e-12, abs=1e-15)


def test_wsd_is_a_trapezoid_and_1sqrt_decays_faster_first():
    lin = [lr_at(s, 1.0, 1000, 0.05, "wsd", 0.3, "linear") for s in range(1, 1001)]
    sq = [lr_at(s, 1.0, 1000, 0.05, "wsd", 0.3, "1-sqrt") for s in range(1, 1001)]
    assert all(b >= a for a, b in zip(lin[:50], lin[1:51]))  # up
    assert set(lin[49:700]) == {1.0} and set(sq[49:700]) == {1.0}  # flat top
    assert all(b < a for a, b in zip(lin[700:], lin[701:]))  # strictly down to 0
    assert lin[-1] == sq[-1] == 0.0
    assert all(s <= ln for s, ln in zip(sq[700:], lin[700:]))  # 1-sqrt is below linear through the decay


def test_wsd_config_checks():
    from bertforge.config import OptimConfig
    from bertforge.errors import ConfigError

    OptimConfig(schedule="wsd", warmup=0.1, decay=0.2, decay_shape="1-sqrt").validate()
    with pytest.raises(ConfigError, match="warmup \\+ decay"):
        OptimConfig(schedule="wsd", warmup=0.5, decay=0.6).validate()
    with pytest.raises(ConfigError, match="decay_shape"):
        OptimConfig(schedule="wsd", decay_shape="cosine").validate()
    with pytest.raises(ValueError, match="decay shape"):
        lr_at(90, 1.0, 100, 0.1, "wsd", 0.2, "cosine")


@pytest.mark.parametrize("max_steps,warmup", [(100, 0.1), (37, 0.1), (10, 0.0), (7, 0.5), (3, 0.34)])
def test_linear_is_hugging_faces_schedule_update_for_update(max_steps, warmup):
    """The lr of every update equals what transformers' linear schedule gives it in a Trainer-style loop
    (`optimizer.step(); scheduler.step()`, ceil(warmup_ratio * steps) warmup steps)."""
    import math

    import torch

    transformers = pytest.importorskip("transformers")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2e-5)
    sched = transformers.get_linear_schedule_with_warmup(opt, math.ceil(warmup * max_steps), max_steps)
    hf = []
    for _ in range(max_steps):
        hf.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    ours = [lr_at(n, 2e-5, max_steps, warmup, "linear") for n in range(1, max_steps + 1)]
    assert ours == pytest.approx(hf, rel=1e-12, abs=1e-18)
