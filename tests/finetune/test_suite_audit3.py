"""Audit of the GLUE suite's resume: a result is reused only for the same settings (the preset's contents too,
and no change while the grid runs), tokenized features only for the same task files, and no old key name gets
past the check of the keys the suite sets for each run."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.helpers import write_rte

from bertforge import config as config_mod
from bertforge.errors import UserError
from bertforge.finetune import suite


def _fake_model(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "model.safetensors").write_bytes(b"weights")
    (where / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ngood\nbad\n", encoding="utf-8")
    return where


@pytest.fixture
def fake_grid(monkeypatch):
    """The suite's grid with each run faked (its checks and training are tested elsewhere): returns the list of
    the (task, lr, seed) that ran."""
    ran: list[tuple[str, float, int]] = []
    monkeypatch.setattr(suite, "preflight", lambda opts, log: (["rte"], [1e-4], SimpleNamespace(task=None)))
    monkeypatch.setattr(suite.FeatureCache, "get", lambda self, opts, task, cfg: None)

    def fake_run(opts, task, lr, seed, data, log):
        ran.append((task, lr, seed))
        fp = suite.fingerprint(opts, task)
        return {"task": task, "lr": lr, "seed": seed, "metrics": {"accuracy": 50.0}, "fingerprint": fp}

    monkeypatch.setattr(suite, "run_one", fake_run)
    monkeypatch.setattr(suite, "plot_table", lambda *a: None)
    return ran


def test_an_edited_preset_is_another_recipe(tmp_path, monkeypatch, fake_grid):
    """`--config glue_default` (a preset name, the suite's default) left the fingerprint's config file empty: a
    re-run after editing the preset (another warmup, epochs, batch size) reused every earlier result and wrote a
    table of the old recipe as the new one's."""
    presets = tmp_path / "presets"
    shutil.copytree(config_mod.PRESET_DIR, presets)
    monkeypatch.setattr(config_mod, "PRESET_DIR", presets)
    opts = suite.SuiteOptions(str(write_rte(tmp_path / "glue")), str(_fake_model(tmp_path / "m")), str(tmp_path / "o"))
    suite.run_suite(opts, log=lambda s: None)
    assert fake_grid == [("rte", 1e-4, 42)]
    fake_grid.clear()
    suite.run_suite(opts, log=lambda s: None)  # the same preset: reused
    assert fake_grid == []
    preset = presets / "finetune" / "glue_default.yaml"
    preset.write_text(preset.read_text().replace("epochs: 3", "epochs: 4"))
    with pytest.raises(UserError, match=r"glue_default.*differ.*--overwrite"):
        suite.run_suite(opts, log=lambda s: None)
    assert fake_grid == []
    suite.run_suite(suite.SuiteOptions(**{**opts.__dict__, "overwrite": True}), log=lambda s: None)
    assert fake_grid == [("rte", 1e-4, 42)]


def test_a_preset_edited_while_the_grid_runs_stops_it_instead_of_mixing_recipes(tmp_path, monkeypatch):
    """Each run reads the config file when it starts: a preset edited for the next experiment while a grid ran
    made the later runs another recipe than the earlier ones, recorded and aggregated into one table."""
    presets = tmp_path / "presets"
    shutil.copytree(config_mod.PRESET_DIR, presets)
    monkeypatch.setattr(config_mod, "PRESET_DIR", presets)
    preset = presets / "finetune" / "glue_default.yaml"
    monkeypatch.setattr(suite, "preflight", lambda opts, log: (["rte"], [1e-4], SimpleNamespace(task=None)))
    monkeypatch.setattr(suite.FeatureCache, "get", lambda self, opts, task, cfg: SimpleNamespace(train=[1, 2]))
    epochs: list[float] = []

    def run_finetune(run, cfg, log):
        epochs.append(cfg.train.epochs)
        preset.write_text(preset.read_text().replace("epochs: 3", "epochs: 4"))  # edited during the first run
        return {"best": {"accuracy": 0.5, "epoch": 1}, "train_s": 1.0}

    monkeypatch.setattr("bertforge.finetune.runner.run_finetune", run_finetune)
    monkeypatch.setattr(suite, "plot_table", lambda *a: None)
    out = tmp_path / "o"
    opts = suite.SuiteOptions(str(write_rte(tmp_path / "glue")), str(_fake_model(tmp_path / "m")), str(out))
    opts.seeds = [1, 2]
    with pytest.raises(UserError, match=r"settings in --config glue_default changed while the suite ran.*seed 2"):
        suite.run_suite(opts, log=lambda s: None)
    assert epochs == [3, 4]
    assert [p.name for p in (out / "results" / "rte").iterdir()] == ["lr0.0001_seed1.json"]  # the old recipe's
    assert not (out / "glue_results.json").exists()


def test_features_are_tokenized_again_for_edited_task_files(tmp_path):
    """The cache's key held the glue_dir's path, not its files: a caller's cache kept over suites (the quality
    benchmark's, over two models) served the old rows of an edited train.tsv."""
    glue_dir = write_rte(tmp_path / "glue", n_train=8)
    opts = suite.SuiteOptions(str(glue_dir), str(_fake_model(tmp_path / "m")), str(tmp_path / "o"))
    cache, task_cfg = suite.FeatureCache(), SimpleNamespace(max_seq_len=16)
    assert len(cache.get(opts, "rte", task_cfg).train) == 8
    assert len(cache.get(opts, "rte", task_cfg).train) == 8 and cache.built == 1
    write_rte(tmp_path / "glue2", n_train=12)
    shutil.copy(tmp_path / "glue2" / "RTE" / "train.tsv", glue_dir / "RTE" / "train.tsv")
    assert len(cache.get(opts, "rte", task_cfg).train) == 12 and cache.built == 2
    # the same files elsewhere: the same rows
    shutil.copytree(glue_dir, tmp_path / "copy")
    cache.get(dataclasses.replace(opts, glue_dir=str(tmp_path / "copy")), "rte", task_cfg)
    assert cache.built == 2


@pytest.mark.parametrize(
    ("entry", "lrs", "flag"),
    [("seed=3", [], "--seeds"), ("lr=1e-4", [1e-4], "--lrs"), ("output_dir=x", [], "--output-dir")],
)
def test_an_old_key_name_of_a_setting_the_suite_sets_is_refused_too(tmp_path, entry, lrs, flag):
    """`--set train.seed=3` was refused, but its old name `--set seed=3` (still read, with a notice) passed, and
    the suite's own train.seed then replaced it without a word."""
    opts = suite.SuiteOptions(str(tmp_path), str(tmp_path), str(tmp_path), lrs=lrs, overrides=[entry])
    with pytest.raises(UserError, match=f"--set {entry.split('=')[0]} is the suite's to set for each run: use {flag}"):
        suite._check_overrides(opts)
    suite._check_overrides(dataclasses.replace(opts, overrides=["lr=1e-4"], lrs=[]))  # no --lrs: the lr to run
