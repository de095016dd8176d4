"""The ModernBERT presets against AnswerDotAI/ModernBERT's own training configs and schedulers.

Reference: AnswerDotAI/ModernBERT, branch `pretraining_documentation`, yamls/modernbert/modernbert-{base,large}-
{pretrain,context-extension,learning-rate-decay}.yaml (the published runs' settings) and src/scheduler.py /
Composer's LinearScheduler (their schedules), with Warner et al. 2024 (arXiv 2412.13663) §2.2. The reference's
phase 2 is two runs, 250B tokens at a constant lr then 50B tokens of 1-sqrt decay; bertforge's is one wsd run.
"""

from __future__ import annotations

import math

import pytest

from bertforge.config import load_config
from bertforge.optim.schedule import lr_at

# preset -> the reference yaml's numbers. wd: StableAdamW's decoupled weight decay per update (scaled by the
# schedule, not by the lr); batch/micro: global_train_batch_size / device_train_microbatch_size.
REF = {
    "modernbert_base_1024": dict(
        lr=8e-4, wd=1e-5, batch=4608, micro=96, seq=1024, tokens=1_719e9, warmup=3e9, decay=0.0, theta=10_000.0
    ),
    "modernbert_large_1024": dict(
        lr=5e-4, wd=1e-5, batch=4928, micro=56, seq=1024, tokens=1_719e9, warmup=2e9, decay=0.0, theta=10_000.0
    ),
    # context extension (250B) + decay (50B); large after its phase-1 restart at 5e-5 / 1e-6
    "modernbert_base_8192": dict(
        lr=3e-4, wd=1e-5, batch=576, micro=12, seq=8192, tokens=300e9, warmup=0.0, decay=50e9, theta=160_000.0
    ),
    "modernbert_large_8192": dict(
        lr=5e-5, wd=1e-6, batch=616, micro=7, seq=8192, tokens=300e9, warmup=0.0, decay=50e9, theta=160_000.0
    ),
}
SHAPE = {"base": (22, 768, 1152, 12), "large": (28, 1024, 2624, 16)}


def _cfg(name):
    return load_config("pretrain", name)


def composer_linear(t: float, t_max: float, alpha_i: float, alpha_f: float) -> float:
    """Composer's LinearScheduler at time t."""
    return alpha_i + min(1.0, t / t_max) * (alpha_f - alpha_i)


def ref_wsd(t: float, t_warmup: float, t_decay: float, t_max: float, alpha_f: float = 0.0) -> float:
    """src/scheduler.py WarmupStableDecayScheduler (its decay is linear), warmup from 1e-10."""
    if t < t_warmup:
        return composer_linear(t, t_warmup, 1e-10, 1.0)
    if t < t_max - t_decay or t_decay == 0:  # no decay: Composer stops at t_max before it would divide by 0
        return 1.0
    return max(0.0, 1 - (t - (t_max - t_decay)) / t_decay * (1 - alpha_f))


def ref_one_minus_sqrt(t: float, t_decay: float, t_max: float, alpha_f: float) -> float:
    """src/scheduler.py OneMinusSqrtScheduler."""
    if t <= t_max - t_decay:
        return 1.0
    return max(alpha_f, alpha_f + (1 - alpha_f) * (1 - math.sqrt((t - (t_max - t_decay)) / t_decay)))


@pytest.mark.parametrize("name", sorted(REF))
def test_optimizer_is_the_references(name):
    ref, o = REF[name], _cfg(name).optim
    assert (o.name, o.beta1, o.beta2, o.eps) == ("adamw", 0.9, 0.98, 1e-6)
    assert o.lr == pytest.approx(ref["lr"], rel=1e-12)
    # torch's AdamW decays by lr_t * weight_decay per update; StableAdamW(decouple_lr=True) by wd * lr_t / peak
    assert o.lr * o.weight_decay == pytest.approx(ref["wd"], rel=1e-2)
    assert (o.schedule, o.decay_shape) == ("wsd", "1-sqrt")


@pytest.mark.parametrize("name", sorted(REF))
def test_tokens_batches_and_warmup_are_the_references(name):
    ref, cfg = REF[name], _cfg(name)
    t, o = cfg.train, cfg.optim
    assert (t.global_batch_size, t.micro_batch_size) == (ref["batch"], ref["micro"])
    per_update = ref["batch"] * ref["seq"]
    # within one update of the token budget (phase 2: within 0.1%, its two reference runs end on their own)
    slack = per_update if ref["seq"] == 1024 else 1e-3 * ref["tokens"]
    assert abs(t.max_steps * per_update - ref["tokens"]) <= slack
    assert abs(o.warmup * t.max_steps * per_update - ref["warmup"]) <= per_update
    assert o.decay * t.max_steps * per_update == pytest.approx(ref["decay"], rel=1e-3)


@pytest.mark.parametrize("name", sorted(REF))
def test_model_and_masking_are_the_references(name):
    from bertforge.train.loop import build_bert_config

    ref, cfg = REF[name], _cfg(name)
    b = build_bert_config(cfg, 50368)
    size = name.split("_")[1]
    assert (b.num_hidden_layers, b.hidden_size, b.intermediate_size, b.num_attention_heads) == SHAPE[size]
    assert (b.global_rope_theta, b.local_rope_theta) == (ref["theta"], 10_000.0)
    assert (b.local_attention, b.global_attn_every_n_layers, b.layer_norm_eps) == (128, 3, 1e-5)
    assert (cfg.train.objective, cfg.data.mlm_probability, cfg.data.eval_mlm_probability) == ("mlm", 0.30, 0.15)
    assert (cfg.data.mask_replace_prob, cfg.data.random_replace_prob) == (0.8, 0.1)
    assert (cfg.train.init_checkpoint is not None) == (ref["seq"] == 8192)


@pytest.mark.parametrize("name", ["modernbert_base_1024", "modernbert_large_1024"])
def test_phase1_lr_update_by_update(name):
    """Every update's lr against the reference's warmup_stable_decay (tokens as its time unit, t_decay 0). bertforge
    evaluates update n's lr at n updates done (the NVIDIA convention of optim/schedule.py), Composer before it (at
    n - 1): the curves are compared at the same time, the one-update shift is that convention."""
    ref, cfg = REF[name], _cfg(name)
    per_update, o = ref["batch"] * ref["seq"], cfg.optim
    steps = [*range(1, 3000), *range(3000, cfg.train.max_steps + 1, 997), cfg.train.max_steps]
    for n in steps:
        want = o.lr * ref_wsd(n * per_update, ref["warmup"], 0.0, ref["tokens"])
        got = lr_at(n, o.lr, cfg.train.max_steps, o.warmup, o.schedule, o.decay, o.decay_shape)
        assert got == pytest.approx(want, rel=1e-3), n


@pytest.mark.parametrize("name", ["modernbert_base_8192", "modernbert_large_8192"])
def test_phase2_lr_update_by_update(name):
    """Context extension at a constant lr for 250B tokens, then the decay run's one_minus_sqrt (alpha_f 0.001)
    over 50B, against the preset's single wsd run, every update: the same curve to within 20 updates (0.03% of the
    phase; the reference's two runs each end on a whole update) and 0.1% of the peak (bertforge decays to 0, the
    reference to 0.001 of the peak)."""
    ref, cfg = REF[name], _cfg(name)
    per_update, o, n_max = ref["batch"] * ref["seq"], cfg.optim, cfg.train.max_steps
    constant, shift = ref["tokens"] - ref["decay"], 20 * per_update

    def scale(t: float) -> float:
        return 1.0 if t <= constant else ref_one_minus_sqrt(t - constant, ref["decay"], ref["decay"], 0.001)

    assert o.lr == pytest.approx(ref["lr"], rel=1e-12)
    for n in range(1, n_max + 1):
        got = lr_at(n, o.lr, n_max, o.warmup, o.schedule, o.decay, o.decay_shape) / ref["lr"]
        t = n * per_update
        assert scale(t + shift) - 1e-3 <= got <= scale(t - shift) + 1e-12, n


@pytest.mark.parametrize("max_steps,warmup,decay", [(100, 0.1, 0.2), (37, 0.0, 1.0), (1000, 0.05, 0.3), (9, 0.34, 0.0)])
def test_wsd_is_the_reference_formula_step_by_step(max_steps, warmup, decay):
    """optim.schedule wsd, linear decay = WarmupStableDecayScheduler (alpha_f 0); 1-sqrt = the warmup and plateau
    of the same with OneMinusSqrtScheduler's decay (alpha_f 0), at every step, in steps as the time unit."""
    w, d = warmup * max_steps, decay * max_steps
    for n in range(1, max_steps + 3):  # and past the end: 0, never negative
        lin = lr_at(n, 1.0, max_steps, warmup, "wsd", decay, "linear")
        assert lin == pytest.approx(ref_wsd(n, w, d, max_steps), abs=1e-9), n
        sq = lr_at(n, 1.0, max_steps, warmup, "wsd", decay, "1-sqrt")
        if d and n >= max_steps - d:  # the decay (and past the end: its last value, 0)
            want = ref_one_minus_sqrt(min(n, max_steps), d, max_steps, 0.0)
        else:  # warmup and plateau
            want = ref_wsd(n, w, 0.0, max_steps)
        assert sq == pytest.approx(want, abs=1e-9), n


def test_weight_decay_skips_the_references_params():
    """filter_bias_norm_wd: no decay on 1-d parameters (norm weights) and biases; everything else (embeddings
    included) decays."""
    from bertforge.model import build_model
    from bertforge.optim.lamb import param_groups
    from bertforge.train.loop import build_bert_config

    cfg = _cfg("modernbert_tiny_1024")
    model = build_model(build_bert_config(cfg, 512), cfg.train.task)
    skip = {n for g in param_groups(model, 0.1) if g["weight_decay"] == 0 for n in g["names"]}
    assert skip == {n for n, p in model.named_parameters() if p.ndim <= 1 or n.endswith(".bias")}
