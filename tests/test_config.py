import dataclasses
import re

import pytest
from tests.helpers import one_line

from bertforge import config as C
from bertforge.errors import ConfigError
from bertforge.model.config import MODEL_PRESETS, BertConfig


@pytest.mark.parametrize("kind,name", [(kind, name) for kind in C.CONFIG_KINDS for name in C.list_presets(kind)])
def test_every_shipped_preset_loads_and_validates(kind, name):
    cfg = C.load_config(kind, name)
    assert dataclasses.is_dataclass(cfg)


def test_presets_exist_for_every_kind():
    for kind in C.CONFIG_KINDS:
        assert C.list_presets(kind), f"no preset for {kind}"


def test_override_sets_typed_values():
    cfg = C.load_config("pretrain", "demo_tiny_128", ["train.max_steps=7", "optim.lr=1e-3", "train.compile=true"])
    assert cfg.train.max_steps == 7 and isinstance(cfg.train.max_steps, int)
    assert cfg.optim.lr == pytest.approx(1e-3)
    assert cfg.train.compile is True


def test_moved_keys_keep_working_and_name_the_new_key(tmp_path, capsys):
    """Runtime choices left the model section: old files and --set names still load, with a rename notice."""
    old = tmp_path / "old.yaml"
    old.write_text("model:\n  preset: tiny\n  attention: eager\ntrain:\n  max_steps: 3\n")
    cfg = C.load_config("pretrain", old, ["model.compile=true"])
    assert cfg.train.attention == "eager" and cfg.train.compile is True
    err = capsys.readouterr().err
    assert "model.attention is now train.attention" in err and "--set train.compile" in err
    both = tmp_path / "both.yaml"
    both.write_text("model:\n  attention: eager\ntrain:\n  attention: sdpa\n")
    with pytest.raises(ConfigError, match="keep train.attention"):
        C.load_config("pretrain", both)


def test_unknown_override_key_suggests():
    with pytest.raises(ConfigError, match=r"did you mean 'max_steps'"):
        C.load_config("pretrain", "demo_tiny_128", ["train.max_step=7"])


def test_unknown_section_suggests():
    with pytest.raises(ConfigError, match=r"did you mean 'optim'"):
        C.load_config("pretrain", None, ["optm.lr=1"])


def test_bad_value_type_names_the_key():
    with pytest.raises(ConfigError, match=r"train.max_steps: expected int"):
        C.load_config("pretrain", "demo_tiny_128", ["train.max_steps=abc"])


def test_validation_error_says_what_to_change():
    with pytest.raises(ConfigError, match=r"not a multiple of train.micro_batch_size"):
        C.load_config("pretrain", "demo_tiny_128", ["train.global_batch_size=100", "train.micro_batch_size=64"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.lr=nan", "optim.lr must be a finite number > 0, got nan"),
        ("optim.lr=inf", "optim.lr must be a finite number > 0, got inf"),
        ("optim.beta2=1.5", "optim.beta2 is a moment's decay in [0, 1), got 1.5"),
        ("optim.beta1=-0.1", "optim.beta1 is a moment's decay in [0, 1)"),
        ("optim.eps=-1", "optim.eps must be a finite number > 0"),
        ("optim.weight_decay=-1", "optim.weight_decay must be a finite number >= 0"),
        ("train.max_steps=-1", "train.max_steps must be >= 1, got -1"),
        ("train.max_steps=0", "train.max_steps must be >= 1, got 0"),
    ],
)
def test_optimizer_values_and_steps_are_refused_in_one_line(override, message):
    """A NaN lr would train a step and save NaN weights; a beta of 1.5 was torch's traceback at set-up."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        C.load_config("pretrain", "demo_tiny_128", [override])


def test_invalid_yaml_is_one_line_with_where(tmp_path):
    path = tmp_path / "e.yaml"
    path.write_text("train:\n\tmax_steps: 5\n")
    with pytest.raises(ConfigError) as e:
        C.load_config("pretrain", str(path), [])
    one_line(str(e.value), path, "is not valid YAML", "at line 2, column 1")


@pytest.mark.parametrize("text", ["", "# every setting commented out\n# train:\n#   max_steps: 5\n"])
def test_an_empty_config_file_is_refused_not_run_as_the_defaults(tmp_path, text):
    """`data prepare --config empty.yaml` ran the whole default chain (the built-in corpus into runs/data) and
    exited 0: an empty file is a truncated or unsaved one far more often than a wish for the defaults."""
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    for kind in ("data", "pretrain", "finetune"):
        with pytest.raises(ConfigError) as e:
            C.load_config(kind, str(path), [])
        one_line(str(e.value), path, "is empty (no settings, or only comments)", "leave --config out")


@pytest.mark.parametrize("value", ["2024_01", "0123", "12:30", "1.10", "on", "runs/my run #2", "@x", "'a b'", "*x"])
def test_a_text_setting_takes_the_text_as_written(value):
    """YAML turned `--set train.output_dir=0123` into '83' and cut at a #, and `@x` was a traceback."""
    cfg = C.load_config("pretrain", "demo_tiny_128", [f"train.output_dir={value}"])
    assert cfg.train.output_dir == ("a b" if value == "'a b'" else value)  # quotes still quote


def test_an_override_that_is_not_yaml_and_unquoted_yaml_text_in_a_file_are_one_line(tmp_path):
    with pytest.raises(ConfigError) as e:
        C.load_config("pretrain", "demo_tiny_128", ["train.max_steps=@5"])
    one_line(str(e.value), "--set train.max_steps: '@5' is not a YAML value", "quote it")
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  output_dir: 0755\n")
    with pytest.raises(ConfigError) as e:
        C.load_config("pretrain", str(path))
    one_line(str(e.value), "train.output_dir: YAML reads 493 as an int, not as text; quote it", path)
    path.write_text("train:\n  output_dir: '0755'\n")
    assert C.load_config("pretrain", str(path)).train.output_dir == "0755"


@pytest.mark.parametrize(
    "sets,message",
    [
        (["optim.decay=0.5"], "optim.decay and optim.decay_shape shape the wsd schedule's final decay"),
        (["optim.decay_shape=1-sqrt"], "which would ignore them: set optim.schedule=wsd"),
        (["data.synthetic_seq_len=512", "data.synthetic_pack=3"], "data.synthetic_seq_len, data.synthetic_pack"),
        (["model.preset=modernbert-tiny", "model.global_rope_theta=-1"], "global_rope_theta is a rotary base"),
        (["model.preset=modernbert-tiny", "model.global_rope_theta=.nan"], "global_rope_theta is a rotary base"),
        (["model.preset=modernbert-tiny", "train.objective=mlm_nsp"], "which modernbert-tiny does not have"),
    ],
)
def test_settings_the_run_would_ignore_or_die_on_are_refused(sets, message):
    """WSD's decay keys under another schedule and data.synthetic_* with shards were accepted and ignored; a
    negative rotary base trained 20 non-finite steps, then advised a lower learning rate."""
    with pytest.raises(ConfigError) as e:
        C.load_config("pretrain", "demo_tiny_128", sets)
    one_line(str(e.value), message)
    C.load_config("pretrain", "demo_tiny_128", ["optim.schedule=wsd", "optim.decay=0.5", "optim.decay_shape=1-sqrt"])


def test_the_ddp_timeout_reaches_the_process_group_and_must_be_positive(monkeypatch, tmp_path):
    """Fine-tuning's evaluation runs on rank 0 while the others wait: a fixed 30 minutes failed a long one."""
    from bertforge.runtime import distributed
    from bertforge.train.loop import run_pretrain

    for bad in ("0", "1e-9", "1e14", ".nan"):
        with pytest.raises(ConfigError, match="train.ddp_timeout is seconds between 1 and 604800"):
            C.load_config("pretrain", "demo_tiny_128", [f"train.ddp_timeout={bad}"])
    seen = []

    def init(device, timeout_s):
        seen.append(timeout_s)
        raise RuntimeError("stop here")

    monkeypatch.setattr(distributed, "init_distributed", init)
    with pytest.raises(RuntimeError, match="stop here"):
        # an output dir of its own: the demo's runs/demo/pretrain, where a demo ran, is refused before the group
        run_pretrain(
            C.load_config("pretrain", "demo_tiny_128", ["train.ddp_timeout=7200", f"train.output_dir={tmp_path}"])
        )
    assert seen == [7200.0]


def test_a_key_given_twice_in_a_file_is_refused(tmp_path):
    """PyYAML keeps the last of two `train:` blocks: the first one's settings were dropped without a word. A
    merge (`<<: *anchor`) may still be overridden, and an unhashable key is PyYAML's one line."""
    path = tmp_path / "dup.yaml"
    path.write_text("train: {max_steps: 10}\ntrain: {seed: 3}\n")
    with pytest.raises(ConfigError) as e:
        C.load_config("pretrain", str(path))
    one_line(str(e.value), path, "is not valid YAML", "key 'train' is given twice (line 2)")
    path.write_text("train:\n  <<: {max_steps: 10, seed: 3}\n  seed: 4\n")
    t = C.load_config("pretrain", str(path)).train
    assert (t.max_steps, t.seed) == (10, 4)
    path.write_text("train:\n  [a, b]: 1\n")
    with pytest.raises(ConfigError) as e:
        C.load_config("pretrain", str(path))
    one_line(str(e.value), path, "is not valid YAML", "unhashable key")


def test_a_required_text_setting_set_to_null_is_refused_and_inner_quotes_are_text():
    with pytest.raises(ConfigError) as e:
        C.load_config("pretrain", "demo_tiny_128", ["train.output_dir=null"])
    one_line(str(e.value), "train.output_dir: a value is required")
    assert C.load_config("pretrain", "demo_tiny_128", ["data.eval_dir=~"]).data.eval_dir is None
    cfg = C.load_config("pretrain", "demo_tiny_128", ["train.output_dir='a' and 'b'", "train.precision='bf16'"])
    assert (cfg.train.output_dir, cfg.train.precision) == ("'a' and 'b'", "bf16")


def test_fp8_refuses_unpadding_before_the_run():
    """torch._scaled_mm needs token counts in multiples of 16: unpadded steps would fail at their first backward."""
    with pytest.raises(ConfigError, match=r"train.fp8.*train.attention=varlen.*use train.attention=auto"):
        C.load_config("pretrain", "demo_tiny_128", ["train.fp8=true", "train.attention=varlen"])
    assert C.load_config("pretrain", "demo_tiny_128", ["train.fp8=true"]).train.attention == "auto"


def test_unknown_key_in_yaml_file(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("train:\n  outptu_dir: x\n")
    with pytest.raises(ConfigError, match=r"train.outptu_dir.*did you mean 'output_dir'.*x.yaml"):
        C.load_config("pretrain", path)


def test_missing_preset_lists_choices():
    with pytest.raises(ConfigError, match=r"demo_tiny_128"):
        C.load_config("pretrain", "demo_tiny_12")


def test_bad_model_preset():
    with pytest.raises(ConfigError, match=r"did you mean 'base'"):
        C.load_config("pretrain", None, ["model.preset=bse"])


def test_field_docs_are_read():
    docs = C.field_docs(C.ModelConfig)
    assert "Size preset" in docs["preset"]
    rows = C.describe(C.config_class("pretrain"))
    keys = {r[0] for r in rows}
    for key in (
        "model.preset",
        "data.input_dir",
        "data.eval_dir",
        "train.output_dir",
        "train.max_steps",
        "train.global_batch_size",
        "train.micro_batch_size",
        "train.precision",
        "train.seed",
        "train.log_every",
        "train.save_every",
        "optim.name",
        "optim.lr",
        "optim.warmup",
    ):
        assert key in keys
    assert all(doc for _, _, doc in rows), "every config field needs a docstring"


def test_every_config_field_has_a_docstring():
    for kind in C.CONFIG_KINDS:
        for key, _, doc in C.describe(C.config_class(kind)):
            assert doc, f"{kind}: {key} has no docstring"


@pytest.mark.parametrize(
    "name,layers,hidden,heads",
    [
        ("tiny", 2, 128, 2),
        ("mini", 4, 256, 4),
        ("small", 4, 512, 8),
        ("medium", 8, 512, 8),
        ("base", 12, 768, 12),
        ("large", 24, 1024, 16),
    ],
)
def test_model_presets(name, layers, hidden, heads):
    cfg = BertConfig.from_preset(name)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads) == (layers, hidden, heads)
    assert cfg.intermediate_size == 4 * hidden
    assert cfg.vocab_size == 30522 and cfg.max_position_embeddings == 512
    bert = {k for k, v in MODEL_PRESETS.items() if v.model_type == "bert"}
    assert bert == {"tiny", "mini", "small", "medium", "base", "large"}


def _resolved(fast: bool, packed: bool = False, **train) -> tuple[bool | None, bool | None, bool | None]:
    t, o = C.resolve_auto(C.TrainConfig(**train), C.OptimConfig(), fast, packed)
    return t.compile, t.cuda_graphs, o.compile


def test_auto_fast_paths_follow_the_measured_table():
    """train.compile, train.cuda_graphs and optim.compile default to auto: all on for pre-training on one CUDA
    device (`fast`) where every step has one shape (packed rows under auto attention, padded rows under sdpa),
    CUDA graphs off where shapes vary or under FP8 or layer scope, everything off elsewhere; a user's value
    stays as set."""
    t = C.TrainConfig()
    assert (t.compile, t.cuda_graphs, C.OptimConfig().compile) == (None, None, None)
    assert _resolved(False) == (False, False, False)
    assert _resolved(False, packed=True, attention="sdpa") == (False, False, False)
    assert _resolved(True, packed=True) == (True, True, True)
    assert _resolved(True, attention="sdpa") == (True, True, True)
    assert _resolved(True) == (True, False, True)  # unpacked rows: segment bounds of varying sizes
    assert _resolved(True, packed=True, attention="eager") == (True, False, True)
    assert _resolved(True, packed=True, fp8=True) == (True, False, True)
    assert _resolved(True, packed=True, compile=True, compile_scope="layers") == (True, False, True)
    assert _resolved(True, packed=True, compile=False) == (False, False, True)
    assert _resolved(True, packed=True, activation_checkpointing=True) == (False, False, True)
    assert _resolved(True, packed=True, cuda_graphs=False) == (True, False, True)
    assert _resolved(False, compile=True, cuda_graphs=True, attention="sdpa") == (True, True, False)
    t, o = C.resolve_auto(C.TrainConfig(), C.OptimConfig(name="adamw"), True, True)
    assert o.compile is False  # torch's AdamW is fused already


def test_auto_bf16_layernorms_only_for_fast_bf16_pretraining():
    """train.low_precision_layernorm defaults to auto: on where the H100 loop measured it (pre-training on one
    CUDA device, `fast`, in bf16: 1.044x, its 300-step curve on the fp32 norms' track), off on the CPU, in fp16
    (not measured) and fp32 (no autocast dtype); a user's value stays as set. The run's config.yaml records the
    decision, so a resume reads the same."""
    assert C.TrainConfig().low_precision_layernorm is None

    def norms(fast: bool, precision: str, **train) -> bool | None:
        return C.resolve_auto(C.TrainConfig(**train), C.OptimConfig(), fast, True, precision)[0].low_precision_layernorm

    assert norms(True, "bf16") is True
    assert (norms(False, "bf16"), norms(True, "fp16"), norms(True, "fp32")) == (False, False, False)
    assert norms(True, "bf16", low_precision_layernorm=False) is False
    assert norms(False, "bf16", low_precision_layernorm=True) is True
    keys = {key: default for key, default, _ in C.describe(C.load_config("pretrain", "demo_tiny_128", []).__class__)}
    assert keys["train.low_precision_layernorm"] == "auto"


def test_auto_is_a_value_of_the_auto_switches_and_refused_elsewhere():
    cfg = C.load_config("pretrain", "demo_tiny_128", ["train.compile=true", "train.compile=auto", "optim.compile=auto"])
    assert cfg.train.compile is None and cfg.optim.compile is None
    keys = {key: default for key, default, _ in C.describe(type(cfg))}
    assert (keys["train.compile"], keys["train.cuda_graphs"], keys["optim.compile"]) == ("auto", "auto", "auto")
    with pytest.raises(ConfigError, match="train.tensorboard"):
        C.load_config("pretrain", "demo_tiny_128", ["train.tensorboard=auto"])
    with pytest.raises(ConfigError, match="set train.compile=true as well"):  # graphs asked for: compile too
        C.load_config("pretrain", "demo_tiny_128", ["train.cuda_graphs=true"])
