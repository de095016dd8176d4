"""ModernBERT: our model (a row of `ARCHITECTURES`) vs `transformers`' ModernBERT on the same random weights,
fp32, eval: hidden states and logits of every head, padded and unpadded, sequences shorter than, as long as and
longer than the local window; our saves load in transformers with no missing or unexpected weights."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from bertforge.errors import ConfigError
from bertforge.model import BertConfig, build_model
from bertforge.model.hf_interop import load_pretrained, save_pretrained

ATOL = 1e-5
V, WINDOW = 97, 16
IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
HF_CLASSES = {
    "mlm": "ModernBertForMaskedLM",
    "qa": "ModernBertForQuestionAnswering",
    "classification": "ModernBertForSequenceClassification",
    "regression": "ModernBertForSequenceClassification",
    "token_classification": "ModernBertForTokenClassification",
}
AUTO = {
    "mlm": "AutoModelForMaskedLM",
    "qa": "AutoModelForQuestionAnswering",
    "classification": "AutoModelForSequenceClassification",
    "regression": "AutoModelForSequenceClassification",
    "token_classification": "AutoModelForTokenClassification",
}


def hf_config(task: str = "mlm", local_attention: int = WINDOW, **kw):
    labels = {"regression": 1, "classification": 3, "token_classification": 3}.get(task, 2)
    return transformers.ModernBertConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,  # global, local, local, global
        num_attention_heads=2,
        max_position_embeddings=512,
        local_attention=local_attention,
        num_labels=labels,
        **{"attn_implementation": "eager", **IDS, **kw},
    )


def hf_model(tmp_path, task: str = "mlm", seed: int = 0, **kw):
    """A transformers model with random weights (norms and biases too), saved to tmp_path/hf."""
    torch.manual_seed(seed)
    model = getattr(transformers, HF_CLASSES[task])(hf_config(task, **kw)).eval()
    with torch.no_grad():  # LayerNorm weights away from 1 so a misplaced norm cannot pass
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp_path / "hf")
    return model


def batch(T: int, seed: int = 0):
    """(B=3, T) ids and a padding mask with lengths T, T - 3, 5."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (3, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor([T, T - 3, 5])[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


def close(a, b, mask=None):
    """Equal within ATOL at the real tokens (padding positions carry no defined value)."""
    if mask is not None:
        a, b = a[mask.bool()], b[mask.bool()]
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


@pytest.mark.parametrize("T", [10, WINDOW, 40])
@pytest.mark.parametrize("impl", ["eager", "sdpa", "varlen", "auto"])
def test_mlm_hidden_states_and_logits_match(tmp_path, T, impl):
    """Below, at and above the local window; padded (eager/sdpa/auto) and unpadded (varlen: the encoder runs on
    the N real tokens, attention re-padded with the window in its mask)."""
    theirs = hf_model(tmp_path)
    ours, config = load_pretrained(tmp_path / "hf", "mlm", attention=impl)
    assert config.model_type == "modernbert" and config.local_attention == WINDOW
    ids, mask = batch(T)
    with torch.no_grad():
        o = ours.eval()(ids, mask)
        h = theirs(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    close(o.last_hidden_state, theirs.model(input_ids=ids, attention_mask=mask).last_hidden_state, mask)
    close(o.mlm_logits, h.logits, mask)


def test_window_128_and_a_long_sequence(tmp_path):
    """The published window (128) on a 300-token row, with sdpa on the Hugging Face side too."""
    theirs = hf_model(tmp_path, local_attention=128, attn_implementation="sdpa")
    ours, config = load_pretrained(tmp_path / "hf", "mlm", attention="varlen")
    assert config.local_attention == 128
    ids, mask = batch(300)
    with torch.no_grad():
        close(ours.eval()(ids, mask).mlm_logits, theirs(input_ids=ids, attention_mask=mask).logits, mask)


def test_the_window_changes_the_output(tmp_path):
    """A control for the tests above: a longer window changes the output of long rows, not of short ones."""
    hf_model(tmp_path)
    ours, config = load_pretrained(tmp_path / "hf", "mlm", attention="sdpa")
    wide = build_model(BertConfig(**{**config.to_dict(), "local_attention": 64}), "mlm", attention="sdpa")
    wide.load_state_dict(ours.state_dict())
    for T, differs in ((8, False), (40, True)):
        ids, mask = batch(T)
        with torch.no_grad():
            a, b = ours.eval()(ids, mask).mlm_logits, wide.eval()(ids, mask).mlm_logits
        assert (a - b).abs().max().item() > 1e-3 if differs else torch.allclose(a, b, atol=1e-6)


def packed(T: int):
    """Two sequences (lengths 11 and T - 11) in one row: sequence index mask, positions restarting at 0."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, V, (1, T), generator=g)
    mask = torch.tensor([[1] * 11 + [2] * (T - 11)])
    positions = torch.cat([torch.arange(11), torch.arange(T - 11)])[None]
    return ids, mask, positions


@pytest.mark.parametrize("impl", ["sdpa", "varlen"])
def test_packed_rows_equal_separate_sequences(tmp_path, impl):
    """Unpadded execution of packed rows: each sequence's output equals transformers' on that sequence alone."""
    theirs = hf_model(tmp_path)
    ours, _ = load_pretrained(tmp_path / "hf", "mlm", attention=impl)
    ids, mask, positions = packed(40)
    with torch.no_grad():
        o = ours.eval()(ids, mask, position_ids=positions).mlm_logits[0]
        for s, e in ((0, 11), (11, 40)):
            close(o[s:e], theirs(input_ids=ids[:, s:e]).logits[0])


def test_flash_varlen_plumbing_with_a_windowed_reference_kernel(tmp_path, monkeypatch):
    """The CUDA path (unpadded q/k/v, rotary tables gathered to (N, 1, D), the kernel's window_size) run on CPU
    with a per-sequence windowed reference standing in for the flash kernel."""
    from bertforge.model import attention as attn

    windows = []

    def reference_varlen(q, k, v, meta, dropout_p, half_window=None):  # (N, nh, D) each
        windows.append(half_window)
        out = torch.empty_like(q)
        cu = meta.cu_seqlens.tolist()
        for s, e in zip(cu[:-1], cu[1:]):
            i = torch.arange(e - s)
            allowed = (i[:, None] - i[None]).abs() <= (half_window if half_window is not None else e)
            out[s:e] = torch.nn.functional.scaled_dot_product_attention(
                q[s:e].transpose(0, 1), k[s:e].transpose(0, 1), v[s:e].transpose(0, 1), attn_mask=allowed
            ).transpose(0, 1)
        return out

    theirs = hf_model(tmp_path)
    ours, _ = load_pretrained(tmp_path / "hf", "mlm", attention="auto")
    monkeypatch.setattr(attn, "varlen_usable", lambda h, d: True)
    monkeypatch.setattr(attn, "varlen", reference_varlen)
    ids, mask = batch(40)
    with torch.no_grad():
        close(ours.eval()(ids, mask).mlm_logits, theirs(input_ids=ids, attention_mask=mask).logits, mask)
    assert windows == [None, WINDOW // 2, WINDOW // 2, None]


def head_compare(ours, theirs, task, ids, mask, labels):
    """Logits at the real tokens of a padded batch; the loss on full rows (QA's softmax runs over every position,
    and padding positions have no defined output: transformers' own eager and sdpa differ there)."""
    with torch.no_grad():
        o = ours(ids, mask)
        h = theirs(input_ids=ids, attention_mask=mask)
    if task == "qa":
        close(o.start_logits, h.start_logits, mask)
        close(o.end_logits, h.end_logits, mask)
    elif task == "mlm":
        close(o.mlm_logits, h.logits, mask)
    else:
        close(o.logits, h.logits, mask if task == "token_classification" else None)
    if labels:
        with torch.no_grad():
            loss = ours(ids, **labels).loss
        torch.testing.assert_close(loss, theirs(input_ids=ids, **labels).loss, atol=ATOL, rtol=0)


LABELS = {
    "mlm": {},
    "qa": {"start_positions": torch.tensor([1, 3, 40]), "end_positions": torch.tensor([2, 5, 4])},
    "classification": {"labels": torch.tensor([0, 2, 1])},
    "regression": {"labels": torch.tensor([0.5, -1.0, 2.0])},
    "token_classification": {},
}


@pytest.mark.parametrize(
    "task,pooling", [(t, "cls") for t in sorted(HF_CLASSES)] + [("classification", "mean"), ("regression", "mean")]
)
def test_load_every_head(tmp_path, task, pooling):
    theirs = hf_model(tmp_path, task, classifier_pooling=pooling)
    ours, config = load_pretrained(tmp_path / "hf", task, num_labels=3, attention="sdpa")
    assert config.classifier_pooling == pooling and not ours.hf_load_info["initialised"]
    ids, mask = batch(24)
    head_compare(ours.eval(), theirs, task, ids, mask, LABELS[task])


@pytest.mark.parametrize("task", sorted(HF_CLASSES))
def test_save_ours_for_theirs(tmp_path, task):
    """Our save loads in transformers' Auto class with no missing, unexpected or mismatched weights."""
    hf_config(task).save_pretrained(tmp_path / "cfg")
    from bertforge.model.hf_interop import config_from_hf

    config = config_from_hf(json.loads((tmp_path / "cfg" / "config.json").read_text()))
    torch.manual_seed(1)
    ours = build_model(config, task, num_labels=3).eval()
    with torch.no_grad():  # norms away from 1, biases away from 0
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    out = save_pretrained(ours, config, tmp_path / "ours", task)
    theirs, info = getattr(transformers, AUTO[task]).from_pretrained(
        out, attn_implementation="sdpa", output_loading_info=True
    )
    assert type(theirs).__name__ == HF_CLASSES[task]
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ids, mask = batch(40)
    head_compare(ours, theirs.eval(), task, ids, mask, LABELS[task])
    again, _ = load_pretrained(out, task, num_labels=3)
    for (k, a), (_, b) in zip(ours.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), k


def test_base_model_directory_starts_a_fine_tuning_head(tmp_path):
    """A ModernBertModel directory (keys without the `model.` prefix) loads under any head, the head fresh;
    fine-tuning's model construction takes it with its dropout overrides."""
    from bertforge.finetune.runner import load_model

    torch.manual_seed(0)
    theirs = transformers.ModernBertModel(hf_config()).eval()
    theirs.save_pretrained(tmp_path / "enc")
    ours, config = load_model(str(tmp_path / "enc"), "classification", 2, "sdpa", {"hidden_dropout_prob": 0.2})
    assert config.hidden_dropout_prob == 0.2 and config.attention_probs_dropout_prob == 0.0
    assert sorted(ours.hf_load_info["initialised"]) == [
        "classifier.bias",
        "classifier.head.LayerNorm.weight",
        "classifier.head.dense.weight",
        "classifier.weight",
    ]
    ids, mask = batch(30)
    with torch.no_grad():
        close(ours.eval()(ids, mask).last_hidden_state, theirs(input_ids=ids, attention_mask=mask)[0], mask)


def test_mlm_loss_on_masked_slots_equals_transformers_dense_loss(tmp_path):
    """The masked-only head (gather first) gives transformers' dense-label loss."""
    theirs = hf_model(tmp_path)
    ours, _ = load_pretrained(tmp_path / "hf", "mlm")
    ids, mask = batch(24)
    positions = torch.tensor([[1, 3, 17, 0], [2, 5, 0, 0], [4, 0, 0, 0]])
    labels_at = torch.randint(0, V, positions.shape)
    dense = torch.full_like(ids, -100)
    for b in range(3):
        for p, lab in zip(positions[b], labels_at[b]):
            if p:
                dense[b, p] = lab
    with torch.no_grad():
        o = ours.eval()(ids, mask, masked_positions=positions, masked_labels=labels_at)
        h = theirs(input_ids=ids, attention_mask=mask, labels=dense)
    torch.testing.assert_close(o.loss, h.loss, atol=ATOL, rtol=0)
    assert int(o.mlm_count) == 6


def test_presets_have_the_published_shapes():
    """Parameter counts equal transformers' ModernBERT with the published base/large shapes (built on meta)."""
    shapes = {
        "modernbert-base": {},  # ModernBertConfig's defaults are ModernBERT-base's
        "modernbert-large": dict(
            num_hidden_layers=28, hidden_size=1024, intermediate_size=2624, num_attention_heads=16
        ),
    }
    for preset, kw in shapes.items():
        config = BertConfig.from_preset(preset)
        assert (config.vocab_size, config.max_position_embeddings, config.local_attention) == (50368, 8192, 128)
        with torch.device("meta"):
            ours = build_model(config, "mlm")
            theirs = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**kw))
        n_ours = sum(p.numel() for p in ours.parameters())
        assert n_ours == sum(p.numel() for p in theirs.parameters())
        assert round(n_ours / 1e6) == {"modernbert-base": 150, "modernbert-large": 396}[preset]


def test_no_nsp_head_and_config_checks():
    config = BertConfig.from_preset("modernbert-tiny", vocab_size=V)
    with pytest.raises(ConfigError, match="no 'pretraining' head"):
        build_model(config, "pretraining")
    with pytest.raises(ConfigError, match="even head size"):
        BertConfig.from_preset("modernbert-tiny", hidden_size=130, num_attention_heads=2)
    assert config.layer_types == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    assert "local_attention" not in BertConfig().to_dict()  # BERT's config.json stays BERT's


def test_training_step_learns_with_activation_checkpointing():
    """`train_step` on the tiny preset (MLM, masked slots, padded rows) with checkpointed layers: the loss falls
    and the gradients equal those without checkpointing."""
    from bertforge.runtime.activation import apply_activation_checkpointing
    from bertforge.runtime.step import TrainStep, train_step

    config = BertConfig.from_preset("modernbert-tiny", vocab_size=V, max_position_embeddings=64)
    torch.manual_seed(0)
    model = build_model(config, "mlm", attention="varlen")
    ids, mask = batch(32)
    positions = torch.tensor([[1, 3, 17, 30], [2, 5, 20, 0], [4, 0, 0, 0]])
    data = {"input_ids": ids, "attention_mask": mask, "masked_positions": positions}
    data["masked_labels"] = ids.gather(1, positions)
    data["input_ids"] = ids.scatter(1, positions, 1)  # [MASK] stand-in at the slots (slot 0 is [CLS])
    ref = build_model(config, "mlm", attention="varlen")
    ref.load_state_dict(model.state_dict())
    apply_activation_checkpointing(model)
    for m in (model, ref):
        m(**data).loss.backward()
    for (n, a), b in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5, msg=n)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    step = TrainStep.build(model, opt, torch.device("cpu"), "fp32")
    losses = [float(train_step(step, [data], 1).loss) for _ in range(20)]
    assert losses[-1] < 0.5 * losses[0], losses


def test_pretrain_presets_build_the_phase_configs():
    """configs/pretrain/modernbert_*: phase 1 trains with global rotary base 10,000, phase 2 with 160,000."""
    from bertforge.config import load_config
    from bertforge.train.loop import build_bert_config

    for size in ("tiny", "base", "large"):
        for ctx, theta in ((1024, 10000.0), (8192, 160000.0)):
            cfg = load_config("pretrain", f"modernbert_{size}_{ctx}")
            config = build_bert_config(cfg, 50368)
            assert config.modern and config.global_rope_theta == theta and config.local_rope_theta == 10000.0
            assert config.hidden_dropout_prob == 0.0 and cfg.optim.name == "adamw"
    with pytest.raises(ConfigError, match="global_rope_theta"):
        load_config("pretrain", "demo_tiny_128", ["model.global_rope_theta=1e4"])


def test_flops_count_geglu_and_the_window():
    from bertforge.model.flops import encoder_flops

    c = BertConfig.from_preset("modernbert-tiny", vocab_size=V)  # H 128, I 256, 4 layers, window 128
    T, H, I = 1024, 128, 256
    proj = 2 * T * H * 3 * H + 2 * T * H * H + 6 * T * H * I
    assert encoder_flops(c, T) == 4 * proj + 2 * (4 * T * T * H) + 2 * (4 * T * 129 * H)
    assert encoder_flops(BertConfig(), 128) == 12 * (
        2 * 128 * 768 * 3 * 768 + 4 * 128 * 128 * 768 + 2 * 128 * 768**2 + 4 * 128 * 768 * 3072
    )


def test_norms_get_no_weight_decay():
    from bertforge.optim.lamb import param_groups

    model = build_model(BertConfig.from_preset("modernbert-tiny", vocab_size=V), "mlm")
    decay, skip = param_groups(model, 0.01)
    names = dict(model.named_parameters())
    skipped = {n for n, p in names.items() if any(p is q for q in skip["params"])}
    assert skipped == {n for n in names if "norm" in n.lower() or n.endswith("bias")}
    assert "bert.encoder.layer.1.attn_norm.weight" in skipped and "bert.final_norm.weight" in skipped
    assert decay["weight_decay"] == 0.01 and skip["weight_decay"] == 0.0


def test_training_head_projects_only_the_real_slots():
    """Training on CPU in eager mode: the empty slots never reach the vocabulary projection; same loss, counts
    and gradients as the full (B*P) slot layout of eval mode."""
    model = build_model(BertConfig.from_preset("modernbert-tiny", vocab_size=V), "mlm")  # no dropout
    ids, mask = batch(24)
    positions = torch.tensor([[1, 3, 17, 0], [2, 5, 0, 0], [4, 0, 0, 0]])
    kw = {"masked_positions": positions, "masked_labels": torch.randint(0, V, positions.shape)}
    outs = {}
    for mode in ("train", "eval"):
        getattr(model, mode)()
        outs[mode] = out = model(ids, mask, **kw)
        out.loss.backward()
        outs[mode + "_grad"] = model.bert.embeddings.tok_embeddings.weight.grad.clone()
        model.zero_grad()
    assert outs["train"].mlm_logits.shape == (6, V) and outs["eval"].mlm_logits.shape == (12, V)
    torch.testing.assert_close(outs["train"].loss, outs["eval"].loss)
    assert int(outs["train"].mlm_correct) == int(outs["eval"].mlm_correct) and int(outs["train"].mlm_count) == 6
    torch.testing.assert_close(outs["train_grad"], outs["eval_grad"])


@pytest.mark.parametrize("task", ["mlm", "qa"])
def test_onnx_export(tmp_path, task):
    """ONNX export of a ModernBERT directory (17-token rows, window 8: the local mask is traced) agrees with
    PyTorch."""
    pytest.importorskip("onnxruntime")
    from bertforge.serve.export import export_onnx

    config = BertConfig.from_preset("modernbert-tiny", vocab_size=V, local_attention=8)
    save_pretrained(build_model(config, task), config, tmp_path / "m", task)
    result = export_onnx(tmp_path / "m", tmp_path / "onnx")
    assert result["head"] == task and result["max_abs_diff"] < 1e-4


def test_export_of_the_bare_encoder_loads_as_transformers_modernbertmodel(tmp_path):
    """`export --task embed` of a ModernBERT was a KeyError (no bare architecture), and its key table kept nothing:
    transformers would have filled an empty file with random weights."""
    from bertforge.serve.export import export_hf

    theirs = hf_model(tmp_path)
    out = export_hf(tmp_path / "hf", tmp_path / "bare", task="embed")
    bare = transformers.ModernBertModel.from_pretrained(out, attn_implementation="eager").eval()
    assert json.loads((out / "config.json").read_text())["architectures"] == ["ModernBertModel"]
    ids, mask = batch(12)
    with torch.no_grad():
        want = theirs.model(input_ids=ids, attention_mask=mask).last_hidden_state
        got = bare(input_ids=ids, attention_mask=mask).last_hidden_state
    close(got, want, mask)


def test_init_from_takes_the_configured_rotary_base(tmp_path):
    """`model.init_from` kept the checkpoint's global_rope_theta (10,000 in a phase-1 export; rope_parameters in
    the file) while config.yaml recorded the setting (160,000): the context-extension presets rely on it."""
    hf_model(tmp_path)
    model, config = load_pretrained(tmp_path / "hf", "mlm", config_overrides={"global_rope_theta": 20000.0})
    assert config.global_rope_theta == 20000.0 and model.config.global_rope_theta == 20000.0
    own, _ = load_pretrained(tmp_path / "hf", "mlm")
    assert own.config.global_rope_theta == 160000.0  # the file's (transformers' default)
    ids, mask = batch(40)
    with torch.no_grad():  # the rotary tables were built with it: the global layers see other positions
        assert not torch.allclose(model.eval()(ids, mask).mlm_logits, own.eval()(ids, mask).mlm_logits)


def test_a_vocab_mismatch_names_the_setting_to_change():
    """ModernBERT's word embeddings are `tok_embeddings`: the advice fell through to a head's num_labels."""
    from bertforge.model.hf_interop import _shape_hint

    assert "set model.vocab_size" in _shape_hint("bert.embeddings.tok_embeddings.weight", 30522)
