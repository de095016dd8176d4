"""ModernBERT: our model against transformers' `ModernBert*` on the same random weights (fp32, CPU, eval),
in the corners `tests/model/test_modernbert.py` leaves at their defaults (every bias flag on, no decoder bias, odd
and narrow windows, another global-layer period, other rotary bases), the init's distribution, how a config.json
that leaves fields out is read, and the presets' classifier pooling (the published config.json's `mean`)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
import transformers

from bertforge.errors import UserError
from bertforge.model import BertConfig, build_model
from bertforge.model.hf_interop import config_from_hf, hf_state_dict, load_pretrained, save_pretrained

V = 101
ATOL = 1e-5
IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
SMALL = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4)


def hf_config(**kw) -> transformers.ModernBertConfig:
    return transformers.ModernBertConfig(
        **{**SMALL, "max_position_embeddings": 256, "num_labels": 3, "attn_implementation": "eager", **IDS, **kw}
    )


def hf_model(cls: str, tmp_path, **kw):
    """A transformers model with every weight moved off its init (norms away from 1, biases away from 0), saved to
    tmp_path/hf."""
    torch.manual_seed(0)
    model = getattr(transformers, cls)(hf_config(**kw)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp_path / "hf")
    return model


def batch(T: int = 40):
    """(B=3, T) ids, right-padded to lengths T, T - 7, 4."""
    g = torch.Generator().manual_seed(1)
    mask = (torch.arange(T)[None] < torch.tensor([T, T - 7, 4])[:, None]).long()
    return torch.randint(3, V, (3, T), generator=g).masked_fill(mask == 0, 0), mask


def logits_of(out, task: str) -> torch.Tensor:
    return out.mlm_logits if task == "mlm" else out.logits


def real(x: torch.Tensor, mask: torch.Tensor, task: str) -> torch.Tensor:
    """Per-token logits at the real tokens only (padding outputs are undefined); pooled logits as they are."""
    return x[mask.bool()] if task == "mlm" else x


VARIANTS = {
    # every bias ModernBERT can have, and the MLM decoder without its own
    "biases": dict(norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True, decoder_bias=False),
    # an odd window: local_attention // 2 = 7 keys either side (HF's sliding_window), a global layer every 2nd
    "odd_window": dict(local_attention=15, global_attn_every_n_layers=2),
    # rotary bases far apart and swapped in size, so a base given to the wrong layer kind shows
    "rope_bases": dict(global_rope_theta=500.0, local_rope_theta=20000.0, local_attention=8),
    "activations": dict(hidden_activation="gelu_pytorch_tanh", classifier_activation="relu"),
}
TASKS = {"mlm": "ModernBertForMaskedLM", "classification": "ModernBertForSequenceClassification"}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("task", sorted(TASKS))
def test_config_variants_match_transformers_and_round_trip(tmp_path, variant, task):
    """Loaded from transformers' directory: the same logits on every kernel (padded eager/sdpa, unpadded varlen);
    saved back: transformers loads our directory with nothing missing and gives its own logits again."""
    kw = {**VARIANTS[variant], "classifier_pooling": "mean"}
    theirs = hf_model(TASKS[task], tmp_path, **kw)
    ids, mask = batch()
    with torch.no_grad():
        want = theirs(input_ids=ids, attention_mask=mask).logits
    for impl in ("eager", "sdpa", "varlen"):
        ours, config = load_pretrained(tmp_path / "hf", task, num_labels=3, attention=impl)
        with torch.no_grad():
            got = logits_of(ours.eval()(ids, mask), task)
        torch.testing.assert_close(real(got, mask, task), real(want, mask, task), atol=ATOL, rtol=0, msg=impl)
    out = save_pretrained(ours, config, tmp_path / "ours", task)
    back, info = getattr(transformers, TASKS[task]).from_pretrained(
        out, attn_implementation="eager", output_loading_info=True
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    with torch.no_grad():
        again = back.eval()(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(real(again, mask, task), real(want, mask, task), atol=0, rtol=0)


def test_init_has_transformers_distribution():
    """`init_modern_weights` against ModernBertPreTrainedModel._init_weights, tensor by tensor: the same std (in,
    out = std / sqrt(2 L), final = hidden**-0.5), truncated at initializer_cutoff_factor (2) std, zero biases,
    unit norms. std 0.05 and 4 layers so the three stds differ clearly (0.05, 0.018, 0.125)."""
    kw = dict(SMALL, num_hidden_layers=4)
    kw.update(initializer_range=0.05, norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True)
    cfg = transformers.ModernBertConfig(**kw, num_labels=16, **IDS)
    config = config_from_hf(cfg.to_dict())
    for task, cls in TASKS.items():
        torch.manual_seed(0)
        theirs = dict(getattr(transformers, cls)(cfg).named_parameters())
        torch.manual_seed(0)
        ours = hf_state_dict(build_model(config, task, num_labels=16))
        assert set(ours) == set(theirs) - {"decoder.weight"}  # the decoder is tied to the embeddings in both
        for name, b in theirs.items():
            if name == "decoder.weight":
                continue
            a, b = ours[name].float(), b.detach().float()
            if a.dim() == 1:  # biases and norms are constants
                assert torch.equal(a, b), name
                continue
            # two samples of one distribution: their stds agree within a few standard errors (s / sqrt(2n))
            assert math.isclose(a.std(), b.std(), rel_tol=max(0.03, 5 / math.sqrt(2 * a.numel()))), name
            # cut at 2 nominal std: the sample std of a normal truncated at +-2 sigma is 0.88 sigma
            assert a.abs().max() <= 2 * a.std() / 0.86, name


def test_a_sparse_config_json_reads_as_transformers_reads_it():
    """Fields a config.json leaves out take transformers' ModernBertConfig defaults (ModernBERT-base's shape,
    `classifier_pooling: cls`), not a bertforge preset's: the layer count was BERT's 12 (transformers builds 22),
    and the presets' own pooling must not leak into checkpoints that do not name one."""
    ours = config_from_hf({"model_type": "modernbert"})
    hf = transformers.ModernBertConfig()
    pairs = {
        "vocab_size": "vocab_size",
        "hidden_size": "hidden_size",
        "intermediate_size": "intermediate_size",
        "num_hidden_layers": "num_hidden_layers",
        "num_attention_heads": "num_attention_heads",
        "max_position_embeddings": "max_position_embeddings",
        "layer_norm_eps": "norm_eps",
        "pad_token_id": "pad_token_id",
        "initializer_range": "initializer_range",
        "hidden_act": "hidden_activation",
        "hidden_dropout_prob": "mlp_dropout",
        "attention_probs_dropout_prob": "attention_dropout",
        "classifier_pooling": "classifier_pooling",
        "classifier_activation": "classifier_activation",
        "local_attention": "local_attention",
        **{k: k for k in ("norm_bias", "attention_bias", "mlp_bias", "decoder_bias", "classifier_bias")},
    }
    for field, hf_field in pairs.items():
        assert getattr(ours, field) == getattr(hf, hf_field), field
    assert ours.layer_types == hf.layer_types
    assert ours.global_rope_theta == hf.rope_parameters["full_attention"]["rope_theta"]
    assert ours.local_rope_theta == hf.rope_parameters["sliding_attention"]["rope_theta"]


def test_a_checkpoint_that_names_no_pooling_pools_the_first_token(tmp_path):
    """End to end: transformers' classifier saved without `classifier_pooling` in its config.json (its default,
    cls) loads with the same logits."""
    theirs = hf_model(TASKS["classification"], tmp_path)  # classifier_pooling: transformers' default
    cfile = tmp_path / "hf" / "config.json"
    raw = json.loads(cfile.read_text())
    raw.pop("classifier_pooling", None)
    cfile.write_text(json.dumps(raw))
    ours, config = load_pretrained(tmp_path / "hf", "classification", num_labels=3, attention="sdpa")
    assert config.classifier_pooling == "cls"
    ids, mask = batch()
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(ids, mask).logits, theirs(input_ids=ids, attention_mask=mask).logits)


@pytest.mark.parametrize("preset", ["modernbert-tiny", "modernbert-base", "modernbert-large"])
def test_presets_pool_the_mean_as_the_published_config(preset):
    """answerdotai/ModernBERT-base and -large's config.json say classifier_pooling "mean" (docs/modern.md, "The
    ModernBERT architecture and presets", for the sources)."""
    assert BertConfig.from_preset(preset).classifier_pooling == "mean"


def test_a_preset_classifier_saves_mean_pooling_that_transformers_reads(tmp_path):
    """A classifier built from the tiny preset writes classifier_pooling "mean"; transformers' model from that
    directory pools the same way (the mean over the attention-mask tokens), so the logits agree on rows padded to
    different lengths."""
    config = BertConfig.from_preset("modernbert-tiny", **SMALL, max_position_embeddings=256, local_attention=8)
    torch.manual_seed(0)
    ours = build_model(config, "classification", num_labels=3, attention="sdpa").eval()
    out = save_pretrained(ours, config, tmp_path / "ours", "classification")
    assert json.loads((out / "config.json").read_text())["classifier_pooling"] == "mean"
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(out, attn_implementation="eager").eval()
    ids, mask = batch()
    with torch.no_grad():
        torch.testing.assert_close(
            ours(ids, mask).logits, theirs(input_ids=ids, attention_mask=mask).logits, atol=ATOL, rtol=0
        )


@pytest.mark.parametrize(
    "raw",
    [
        # both spellings, disagreeing: transformers reads its own (norm_eps, hidden_activation, mlp_dropout)
        {"layer_norm_eps": 1e-12, "norm_eps": 1e-6, "hidden_act": "gelu_new", "hidden_activation": "gelu"},
        # BERT's spellings alone: transformers ignores them and keeps its defaults
        {"layer_norm_eps": 1e-12, "hidden_act": "gelu_new", "hidden_dropout_prob": 0.3},
    ],
)
def test_bert_spellings_in_a_modernbert_config_are_ignored_as_transformers_ignores_them(raw):
    """A ModernBERT config.json with BERT's field names (older converters wrote `layer_norm_eps` beside `norm_eps`)
    reads as transformers reads it; they had won over transformers' own names, or over its defaults."""
    raw = {"model_type": "modernbert", **raw}
    ours, hf = config_from_hf(raw), transformers.ModernBertConfig.from_dict(raw)
    assert (ours.layer_norm_eps, ours.hidden_act, ours.hidden_dropout_prob) == (
        hf.norm_eps,
        hf.hidden_activation,
        hf.mlp_dropout,
    )


def test_overrides_under_our_names_still_win(tmp_path):
    """`load_pretrained`'s config_overrides use BertConfig's names (fine-tuning's dropout rates)."""
    hf_model(TASKS["mlm"], tmp_path)
    _, config = load_pretrained(tmp_path / "hf", "mlm", config_overrides={"hidden_dropout_prob": 0.2})
    assert config.hidden_dropout_prob == 0.2 and config.attention_probs_dropout_prob == 0.0


def test_init_cutoff_factor_is_read_used_and_written(tmp_path):
    """config.json's initializer_cutoff_factor bounds the init of the weights a checkpoint lacks (a fresh
    fine-tuning head) and a save writes it back: it was fixed at 2 and lost. transformers before v5 took null for
    3 (`_init_weights`), so a null reads as 3."""
    hf_model("ModernBertModel", tmp_path, initializer_range=0.05, initializer_cutoff_factor=3.0)
    ours, config = load_pretrained(tmp_path / "hf", "token_classification", num_labels=3, allow_missing_head=True)
    assert config.initializer_cutoff_factor == 3.0
    # a fresh matrix as large as the embeddings: many draws past 2 sigma, none past 3 (the head's are too small)
    torch.manual_seed(0)
    fresh = build_model(config, "token_classification", num_labels=3).bert.embeddings.tok_embeddings.weight
    z = fresh.detach().abs() / config.initializer_range  # (V, H) in units of the init's std
    assert (z > 2.2).sum() > 20 and z.max() <= 3.0
    out = save_pretrained(ours, config, tmp_path / "ours", "token_classification")
    assert json.loads((out / "config.json").read_text())["initializer_cutoff_factor"] == 3.0
    assert (
        config_from_hf({"model_type": "modernbert", "initializer_cutoff_factor": None}).initializer_cutoff_factor == 3
    )


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"vocab_size": "x"}, "vocab_size must be int, not 'x'"),
        ({"model_type": "modernbert", "num_hidden_layers": 2.5}, "num_hidden_layers must be int, not 2.5"),
        ({"hidden_dropout_prob": "0.1"}, "hidden_dropout_prob must be a number, not '0.1'"),
        ({"decoder_bias": 1}, "decoder_bias must be bool, not 1"),
        # sizes and rates out of range: num_attention_heads 0 was a ZeroDivisionError, hidden_size 0 torch's warning
        ({"num_attention_heads": 0}, "num_attention_heads must be at least 1, not 0"),
        ({"hidden_size": 0}, "hidden_size must be at least 1, not 0"),
        ({"attention_probs_dropout_prob": 1.0}, "attention_probs_dropout_prob must be in [0, 1), not 1.0"),
    ],
)
def test_a_config_json_field_of_the_wrong_type_is_one_line(raw, message):
    """`"vocab_size": "x"` in a hand-edited config.json gave `TypeError: '<' not supported between instances of
    'int' and 'str'` from BertConfig's checks, a traceback from `finetune`, `export` and `serve`."""
    with pytest.raises(UserError, match=re.escape(f"m/config.json: {message}")):
        config_from_hf(raw, "m/config.json")
    assert config_from_hf({"layer_norm_eps": 1, "vocab_size": 100}).layer_norm_eps == 1  # an int for a float is fine


@pytest.mark.parametrize("cut", [2.0, 3.0, 0.5])
def test_trunc_normal_draws_torchs_truncated_normal(cut):
    """`bert.trunc_normal` (redraws outside the cut) against nn.init.trunc_normal_ (inverse CDF, ~13x slower on
    CPU: 15 of ModernBERT-base's 16 s build): the same quantiles within sampling error, nothing outside the cut."""
    from bertforge.model.bert import trunc_normal

    torch.manual_seed(0)
    ours = trunc_normal(torch.empty(400_000), 0.05, cut)
    theirs = torch.nn.init.trunc_normal_(torch.empty(400_000), 0.0, 0.05, -cut * 0.05, cut * 0.05)
    assert ours.abs().max() <= cut * 0.05
    q = torch.linspace(0.01, 0.99, 21)
    assert torch.allclose(ours.quantile(q), theirs.quantile(q), atol=0.01 * cut * 0.05)
    assert math.isclose(ours.std(), theirs.std(), rel_tol=0.01)
