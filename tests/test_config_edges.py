"""Config edge cases: old keys moving into a section the file left empty, values the config passed and a later
stage died on, and the shipped presets held to the numbers of their published sources."""

from __future__ import annotations

import pytest
from tests.helpers import one_line

from bertforge import config as C
from bertforge.errors import ConfigError
from bertforge.model.config import MODEL_PRESETS, BertConfig


@pytest.mark.parametrize(
    "kind,text,where",
    [
        ("pretrain", "model:\n  attention: eager\ntrain:\n", "train in the config file is None"),
        ("pretrain", "model:\n  compile: true\ntrain: 5\n", "train in the config file is 5"),
        ("finetune", "lr: 1.0e-5\noptim:\n", "optim in the config file is None"),
        ("finetune", "dropout: 0.1\nmodel:\n", "model in the config file is None"),
    ],
)
def test_an_old_key_moving_into_an_empty_or_scalar_section_is_one_line(tmp_path, kind, text, where):
    """`lr: ...` beside an `optim:` whose keys were all commented out was a TypeError traceback (`in None`)."""
    path = tmp_path / "old.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        C.load_config(kind, path)
    one_line(str(e.value), "(old name) is now", where, "give it keys or leave it out", path)


def test_old_and_new_key_together_names_the_file_once(tmp_path):
    path = tmp_path / "both.yaml"
    path.write_text("model:\n  attention: eager\ntrain:\n  attention: sdpa\n")
    with pytest.raises(ConfigError) as e:
        C.load_config("pretrain", path)
    line = one_line(str(e.value), "both model.attention (old name) and train.attention are set; keep train.attention")
    assert line.count(str(path)) == 1, line


@pytest.mark.parametrize(
    "kind,sets,message",
    [
        # the loader's workers died on it naming `bertforge pack --max-per-pack`, or it read as packing asked for
        ("pretrain", ["data.pack_per_row=-1"], "data.pack_per_row must be >= 0 (0: no packing), got -1"),
        ("pretrain", ["data.pack_per_row=128"], "data.pack_per_row must be at most 127 (input_mask is int8), got 128"),
        # BertConfig's message, without the key, once the shards were opened
        ("pretrain", ["model.max_position_embeddings=0"], "model.max_position_embeddings must be >= 1"),
        # an unset variable in `--set output_dir=$DIR`: the chain wrote docs/, vocab/ and shards/ into the cwd
        ("data", ["output_dir="], "output_dir is empty: name the directory of the prepared data"),
        ("data", ["output_dir=  "], "output_dir is empty"),
        # emulated FP8 without FP8: the run trained in bf16 (or fp32 on a CPU) and said nothing
        ("pretrain", ["train.fp8_emulate=true"], "train.fp8 is false, so it would be ignored: set train.fp8=true"),
        ("finetune", ["train.fp8_emulate=true"], "train.fp8_emulate runs train.fp8's casts in plain PyTorch"),
    ],
)
def test_values_a_later_stage_died_on_are_refused_at_load(kind, sets, message):
    with pytest.raises(ConfigError) as e:
        C.load_config(kind, None, sets)
    one_line(str(e.value), message)


def test_yaml_specials_in_set_values():
    """`--set` reads a non-text value as YAML: 1e-3 (a string to YAML 1.1) is still a float, yes/no a bool,
    null the unset value, and a yes/no is no number; a text key keeps `no` as written."""
    cfg = C.load_config(
        "pretrain",
        "demo_tiny_128",
        ["optim.lr=1e-3", "train.tensorboard=no", "train.plot=yes", "data.eval_dir=null", "model.vocab_size=~"],
    )
    assert (cfg.optim.lr, cfg.train.tensorboard, cfg.train.plot) == (1e-3, False, True)
    assert cfg.data.eval_dir is None and cfg.model.vocab_size is None
    with pytest.raises(ConfigError, match=r"optim.lr: expected float, got True"):
        C.load_config("pretrain", "demo_tiny_128", ["optim.lr=yes"])
    with pytest.raises(ConfigError, match=r"train.precision must be auto, fp32, bf16, fp16, not 'no'"):
        C.load_config("pretrain", "demo_tiny_128", ["train.precision=no"])


# ------------------------------------------------------------------------------ presets vs their sources
# Google BERT README (miniatures table) and bert_config.json: L, H, A; intermediate 4H
BERT_SHAPES = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


@pytest.mark.parametrize("name", BERT_SHAPES)
def test_bert_presets_are_googles_bert_config_json(name):
    c = BertConfig.from_preset(name)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == BERT_SHAPES[name]
    assert c.intermediate_size == 4 * c.hidden_size
    assert (c.vocab_size, c.max_position_embeddings, c.type_vocab_size, c.hidden_act) == (30522, 512, 2, "gelu")
    assert (c.layer_norm_eps, c.initializer_range) == (1e-12, 0.02)
    assert c.hidden_dropout_prob == c.attention_probs_dropout_prob == 0.1


@pytest.mark.parametrize(
    "name,shape", [("modernbert-base", (22, 768, 12, 1152)), ("modernbert-large", (28, 1024, 16, 2624))]
)
def test_modernbert_presets_are_the_published_config_json(name, shape):
    """answerdotai/ModernBERT-base and -large config.json."""
    c = BertConfig.from_preset(name)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == shape
    assert (c.vocab_size, c.max_position_embeddings, c.layer_norm_eps) == (50368, 8192, 1e-5)
    assert (c.local_attention, c.global_attn_every_n_layers) == (128, 3)
    assert (c.global_rope_theta, c.local_rope_theta) == (160000.0, 10000.0)
    assert not (c.norm_bias or c.attention_bias or c.mlp_bias or c.classifier_bias) and c.decoder_bias
    assert c.hidden_dropout_prob == c.attention_probs_dropout_prob == 0.0
    assert (c.classifier_pooling, c.initializer_cutoff_factor) == ("mean", 2.0)
    assert MODEL_PRESETS[name].model_type == "modernbert"


# NVIDIA DeepLearningExamples PyTorch/LanguageModeling/BERT scripts/configs/pretrain_config.sh (dgxa100_8gpu):
# 8 GPUs x 8192 (phase 1) and x 4096 (phase 2), LAMB, PolyWarmUp
NVIDIA = {128: (65536, 6e-3, 0.2843, 7038), 512: (32768, 4e-3, 0.128, 1563)}


@pytest.mark.parametrize("size", ["base", "large"])
@pytest.mark.parametrize("seq", [128, 512])
def test_bert_pretraining_presets_are_nvidias_recipe(size, seq):
    cfg = C.load_config("pretrain", f"pretrain_{size}_{seq}")
    t, o = cfg.train, cfg.optim
    assert (t.global_batch_size, o.lr, o.warmup, t.max_steps) == NVIDIA[seq]
    assert (o.name, o.schedule, o.weight_decay, o.max_grad_norm, o.beta1, o.beta2, o.eps) == (
        "lamb",
        "poly",
        0.01,
        1.0,
        0.9,
        0.999,
        1e-6,
    )
    assert (cfg.model.preset, cfg.model.hidden_dropout, cfg.model.attention_dropout) == (size, 0.1, 0.1)
    assert (t.init_checkpoint is not None) == (seq == 512)  # phase 2 starts from phase 1
    phase = 1 if seq == 128 else 2
    assert cfg.data.input_dir == f"runs/wiki/shards_phase{phase}"
    data = C.load_config("data", f"wiki_phase{phase}")
    assert data.shards_subdir == f"shards_phase{phase}"


@pytest.mark.parametrize("name,seq,pred", [("wiki_phase1", 128, 20), ("wiki_phase2", 512, 80), ("books_wiki", 128, 20)])
def test_data_presets_are_nvidias_create_datasets_recipe(name, seq, pred):
    """bertPrep.py: dupe factor 5, masked_lm_prob 0.15, short_seq_prob 0.1, seed 12345; Google's uncased vocab
    size."""
    s = C.load_config("data", name).shards
    assert (s.seq_len, s.max_pred, s.dupe_factor, s.masked_lm_prob, s.short_seq_prob, s.seed) == (
        seq,
        pred,
        5,
        0.15,
        0.1,
        12345,
    )
    assert s.objective == "mlm_nsp" and C.load_config("data", name).vocab.vocab_size == 30522


@pytest.mark.parametrize("size,lr,batch", [("base", 8e-4, 4608), ("large", 5e-4, 4928)])
def test_modernbert_pretraining_presets_are_the_papers_recipe(size, lr, batch):
    """Warner et al. 2024 and AnswerDotAI/ModernBERT yamls: 30% masking (evaluated at 15%), MLM only, AdamW betas
    (0.9, 0.98) eps 1e-6, WSD, 1,024 then 8,192 tokens with the global rotary base raised to 160,000."""
    one = C.load_config("pretrain", f"modernbert_{size}_1024")
    two = C.load_config("pretrain", f"modernbert_{size}_8192")
    for cfg in (one, two):
        assert cfg.model.preset == f"modernbert-{size}" and cfg.train.objective == "mlm"
        assert (cfg.data.mlm_probability, cfg.data.eval_mlm_probability) == (0.30, 0.15)
        o = cfg.optim
        assert (o.name, o.schedule, o.decay_shape) == ("adamw", "wsd", "1-sqrt")
        assert (o.beta1, o.beta2, o.eps) == (0.9, 0.98, 1e-6)
        # StableAdamW's decoupled 1e-5 per update = torch AdamW's weight_decay x peak lr (large's phase 2: 1e-6)
        assert o.weight_decay * o.lr == pytest.approx(1e-6 if (size, cfg) == ("large", two) else 1e-5, rel=0.01)
    assert (one.optim.lr, one.train.global_batch_size, one.optim.decay) == (lr, batch, 0.0)
    assert (one.model.global_rope_theta, two.model.global_rope_theta) == (10000.0, 160000.0)
    assert two.train.init_checkpoint == one.train.output_dir
    # tokens per update kept: phase 2's 8,192-token rows x its batch = phase 1's 1,024 x its batch
    assert two.train.global_batch_size * 8192 == one.train.global_batch_size * 1024


@pytest.mark.parametrize("name", ["squad_base_384", "squad_large_384"])
def test_squad_presets_are_run_squads_windows(name):
    """Google run_squad.py / Hugging Face run_qa.py: seq 384, stride 128, query 64, 2 epochs, lr 3e-5, warmup 0.1,
    AdamW with linear decay."""
    cfg = C.load_config("finetune", name)
    k, t, o = cfg.task, cfg.train, cfg.optim
    assert (k.max_seq_len, k.doc_stride, k.max_query_len, k.n_best, k.max_answer_len) == (384, 128, 64, 20, 30)
    assert (t.epochs, o.lr, o.warmup, o.name, o.schedule) == (2, 3e-5, 0.1, "adamw", "linear")


FULL_SIZE = [n for n in C.list_presets("pretrain") if not n.startswith(("demo_", "modernbert_tiny_"))]


@pytest.mark.parametrize("name", FULL_SIZE)
@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_full_size_pretraining_presets_run_on_1_to_8_gpus(name, gpus):
    """modernbert_large_8192's 616 sequences in micro-batches of 8 divided only on one GPU: torchrun on 2, 4 or 8
    stopped at start (global batch not a multiple of micro x processes)."""
    from bertforge.data.loader import batch_arithmetic

    t = C.load_config("pretrain", name).train
    assert batch_arithmetic(t.global_batch_size, t.micro_batch_size, gpus) >= 1


def test_a_preset_name_wins_over_a_folder_of_that_name(tmp_path, monkeypatch):
    """`data prepare --config demo` run where a folder named demo lies was refused as a directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo_tiny_128").mkdir()
    assert C.load_config("data", "demo") == C.load_config("data", C.PRESET_DIR / "data" / "demo.yaml")
    assert C.load_config("pretrain", "demo_tiny_128").train.max_steps == 500
    with pytest.raises(ConfigError, match="is a directory"):  # a folder that is no preset is still said to be one
        C.load_config("pretrain", "demo")


@pytest.mark.parametrize(
    "kind,key",
    [
        ("pretrain", "train.init_checkpoint"),  # phase 2 trained from random weights
        ("pretrain", "model.init_from"),  # random init instead of the checkpoint
        ("pretrain", "data.eval_dir"),  # no evaluation, no word
        ("pretrain", "data.vocab"),  # the working directory's vocab.txt, if any
        ("data", "vocab.vocab_file"),  # a vocab trained instead of the one named
    ],
)
def test_an_empty_optional_path_is_refused_not_read_as_unset(kind, key):
    """`--set train.init_checkpoint=$PHASE1` with PHASE1 unset ran phase 2 from scratch and exited 0."""
    for value in ("", "  ", "''"):
        with pytest.raises(ConfigError) as e:
            C.load_config(kind, None, [f"{key}={value}"])
        one_line(str(e.value), f"{key} is empty: give it a path, or null")
    assert C.load_config(kind, None, [f"{key}=null"]) is not None  # null is still "none"
