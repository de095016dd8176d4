"""The fine-tuning config: the sections shared with pre-training, old flat keys, presets."""

from __future__ import annotations

import pytest

from bertforge import config as C
from bertforge.config import OptimConfig, TrainConfig
from bertforge.errors import ConfigError
from bertforge.finetune.config import FinetuneConfig

OLD_FLAT = """\
max_seq_len: 256
doc_stride: 64
max_query_len: 32
n_best: 10
max_answer_len: 20
null_score_diff_threshold: 0.5
epochs: 2
lr: 3.0e-5
warmup: 0.2
weight_decay: 0.0
adam_eps: 1.0e-8
max_grad_norm: 0.5
max_steps: 7
log_every: 3
batch_size: 16
micro_batch_size: 8
eval_batch_size: 4
precision: fp32
device: cpu
group_by_length: true
pad_to_max_length: true
dropout: 0.05
attention: eager
seed: 3
output_dir: runs/old
"""


def test_old_flat_file_and_set_names_load_into_the_sections(tmp_path, capsys):
    old = tmp_path / "old.yaml"
    old.write_text(OLD_FLAT)
    cfg = C.load_config("finetune", old, ["lr=4e-5", "dropout=0", "batch_size=32"])
    t, o, k, m = cfg.train, cfg.optim, cfg.task, cfg.model
    assert (k.max_seq_len, k.doc_stride, k.max_query_len, k.n_best, k.max_answer_len) == (256, 64, 32, 10, 20)
    assert k.null_score_diff_threshold == 0.5
    assert (t.epochs, t.max_steps, t.log_every, t.global_batch_size, t.micro_batch_size) == (2, 7, 3, 32, 8)
    assert (t.eval_batch_size, t.precision, t.device, t.attention, t.seed) == (4, "fp32", "cpu", "eager", 3)
    assert t.group_by_length and t.pad_to_max_length and t.output_dir == "runs/old"
    assert (o.lr, o.warmup, o.weight_decay, o.eps, o.max_grad_norm) == (4e-5, 0.2, 0.0, 1e-8, 0.5)
    assert m.hidden_dropout == m.attention_dropout == 0.0  # one old key, both new ones; --set wins over the file
    err = capsys.readouterr().err
    assert "config key adam_eps is now optim.eps" in err and "batch_size is now train.global_batch_size" in err
    assert "dropout is now model.hidden_dropout and model.attention_dropout" in err
    assert "--set lr is now --set optim.lr" in err


def test_old_and_new_name_together_is_an_error(tmp_path):
    both = tmp_path / "both.yaml"
    both.write_text("lr: 1.0e-5\noptim:\n  lr: 2.0e-5\n")
    with pytest.raises(ConfigError, match="keep optim.lr"):
        C.load_config("finetune", both)


def test_sections_are_the_shared_ones_with_finetuning_defaults():
    cfg = C.load_config("finetune")
    assert isinstance(cfg.train, TrainConfig) and isinstance(cfg.optim, OptimConfig)
    t, o = cfg.train, cfg.optim
    assert (t.max_steps, t.global_batch_size, t.micro_batch_size, t.seed, t.output_dir, t.log_every) == (
        0,
        32,
        32,
        42,
        "runs/finetune",
        20,
    )
    assert (o.name, o.lr, o.warmup, o.schedule, o.eps, o.weight_decay, o.max_grad_norm) == (
        "adamw",
        2e-5,
        0.1,
        "linear",
        1e-6,
        0.01,
        1.0,
    )
    assert cfg.model.hidden_dropout is None and cfg.model.overrides() is None


def test_the_model_section_holds_only_the_dropouts():
    """The architecture is the --model checkpoint's: a pre-training model key is an error that says so."""
    with pytest.raises(ConfigError, match="unknown key 'model.preset'.*hidden_dropout, attention_dropout"):
        C.load_config("finetune", None, ["model.preset=base"])
    cfg = C.load_config("finetune", None, ["model.attention_dropout=0.2"])
    assert cfg.model.overrides() == {"attention_probs_dropout_prob": 0.2}


@pytest.mark.parametrize("preset", C.list_presets("finetune"))
def test_presets_round_trip(preset, tmp_path, capsys):
    cfg = C.load_config("finetune", preset)
    assert "please rename" not in capsys.readouterr().err  # presets use the new keys
    C.save_config(cfg, tmp_path / "c.yaml")
    assert C.load_config("finetune", tmp_path / "c.yaml") == cfg
    assert cfg.optim.name == "adamw" and cfg.optim.schedule == "linear"


@pytest.mark.parametrize(
    "override,match",
    [
        ("train.eval_every=-1", "eval_every must be >= 0"),
        ("train.epochs=0", "train.epochs must be a finite number > 0, got 0"),
        ("train.epochs=nan", "train.epochs must be a finite number > 0, got nan"),
        ("train.seed=-1", "train.seed must be >= 0, got -1"),
        ("optim.name=sgd", "lamb or adamw"),
        ("train.micro_batch_size=24", "not a multiple"),
    ],
)
def test_invalid_values_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        C.load_config("finetune", None, [override])


def test_every_old_key_has_a_home():
    """Each RENAMED target is a real key of the new tree (a typo there would lose a setting silently)."""
    keys = {k for k, _, _ in C.describe(FinetuneConfig)}
    for old, new in C.renamed_keys(FinetuneConfig).items():
        assert set(new) <= keys, old


def test_cuda_graphs_in_fine_tuning_need_one_padded_length():
    graphs = ["train.compile=true", "train.cuda_graphs=true"]
    with pytest.raises(ConfigError, match="pads each batch to its own longest row .* train.pad_to_max_length=true"):
        C.load_config("finetune", None, graphs)
    assert C.load_config("finetune", None, [*graphs, "train.pad_to_max_length=true"]).train.cuda_graphs
