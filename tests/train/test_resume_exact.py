"""Exact resume (train/checkpoint.py, train/loop.py, data/loader.py): a chained job that repeats
train.stop_after_steps, a stop signal that reaches the data-loader workers, shards changed under a resumed run,
settings that change the data or the update, another process count, a phase 2 chained after an unfinished phase
1, and a checkpoint half-deleted by keep_last."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from tests.helpers import one_line
from tests.train.conftest import VOCAB, logged_losses, make_shards, saved_weights, tiny_config, tiny_overrides

import bertforge
from bertforge import device as dev
from bertforge.cli import main
from bertforge.errors import UserError
from bertforge.runtime.distributed import DistInfo
from bertforge.train import checkpoint as ckpt
from bertforge.train import loop
from bertforge.train.loop import run_pretrain


@pytest.fixture
def shards(tmp_path) -> Path:
    return make_shards(tmp_path / "shards", n_shards=2, rows=16)


def _argv(data: Path, out: Path, *flags: str, **extra) -> list[str]:
    return ["pretrain", *[f"--set={s}" for s in tiny_overrides(data, out, **extra)], *flags]


def test_a_resubmitted_job_with_the_same_stop_after_steps_goes_on(shards, tmp_path):
    """examples/pretrain.sbatch: "add `--set train.stop_after_steps=N` to end cleanly before the limit", and every
    resubmission repeats it. Read as a phase step, the second job stopped where it started and did nothing, for
    ever; it is N more updates of this process."""
    few = {"train.max_steps": 2, "train.save_every": 1, "train.global_batch_size": 4}
    full, chained = tmp_path / "full", tmp_path / "chained"
    run_pretrain(tiny_config(shards, full, **few))
    assert run_pretrain(tiny_config(shards, chained, **few, **{"train.stop_after_steps": 1}))["step"] == 1
    again = run_pretrain(tiny_config(shards, chained, **few, **{"train.stop_after_steps": 1}), resume=True)
    assert again["step"] == 2
    a, b = saved_weights(full), saved_weights(chained)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert logged_losses(full) == logged_losses(chained)


def test_sigterm_to_the_process_group_with_loader_workers_saves(shards, tmp_path):
    """torchrun stops its workers with killpg (start_new_session), and SLURM signals every process of the job:
    the DataLoader workers get the SIGTERM too. torch's worker handler died of it, and the training process then
    failed inside the next step ("DataLoader worker ... is killed by signal: Terminated") with no checkpoint."""
    out = tmp_path / "run"
    sets = tiny_overrides(shards, out, **{"train.max_steps": 1000, "train.save_every": 1000, "data.num_workers": 2})
    env = {**os.environ, "PYTHONPATH": str(Path(bertforge.__file__).parents[1])}
    child = subprocess.Popen(
        [sys.executable, "-m", "bertforge", "pretrain", *[f"--set={s}" for s in sets]],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as torchrun starts each worker
    )
    try:
        deadline = time.monotonic() + 60
        while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").read_text().strip():
            assert child.poll() is None and time.monotonic() < deadline, "the child logged no step"
            time.sleep(0.05)
        os.killpg(child.pid, signal.SIGTERM)  # the training process and its loader workers
        err = child.communicate(timeout=60)[1]
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert child.returncode == 143, err
    saved = ckpt.latest_checkpoint(out / "checkpoints")
    assert saved is not None and saved.load_state()["train_state"]["batches"] > 0
    assert "killed by signal" not in err and f"saved checkpoint {saved.path.name}" in err


def _manifest(shards: Path) -> None:
    """manifest.json as `bertforge data shards` writes it, in the part the loader reads: each shard's rows and
    sha256."""
    entries = [
        {"file": p.name, "instances": 16, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in sorted(shards.glob("*.hdf5"))
    ]
    (shards / "manifest.json").write_text(json.dumps({"shards": entries}))


def test_resume_refuses_shards_added_or_rebuilt_in_the_same_directory(shards, tmp_path, capsys):
    """The lanes are dealt from the shards' row counts: a shard added to data.input_dir (or one rebuilt from other
    documents) gave another data order, silently, because only the directory's path was compared."""
    out = tmp_path / "run"
    _manifest(shards)
    assert main(_argv(shards, out, **{"train.stop_after_steps": 2})) == 0
    make_shards(tmp_path / "more", n_shards=1, rows=16, seed=9)
    (tmp_path / "more" / "shard_0.hdf5").rename(shards / "shard_2.hdf5")
    _manifest(shards)
    capsys.readouterr()
    assert main(_argv(shards, out, "--resume")) == 2
    one_line(capsys.readouterr().err, "--resume", "data.input_dir's shards (2 files, 32 rows -> 3 files, 48 rows")
    (shards / "shard_2.hdf5").replace(shards / "shard_1.hdf5")  # the same name and rows, other rows in it
    _manifest(shards)
    assert main(_argv(shards, out, "--resume")) == 2
    one_line(capsys.readouterr().err, "data.input_dir's shards (2 files, 32 rows -> 2 files, 32 rows", "rebuilt")
    assert main(_argv(shards, out, "--resume", "--allow-changed")) == 0


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("optim.max_grad_norm", 0.5),
        ("data.mlm_probability", 0.3),
        ("data.mask_replace_prob", 0.5),
        ("data.random_replace_prob", 0.2),
        ("data.synthetic_seq_len", 64),
        ("data.synthetic_histogram", "full"),
    ],
)
def test_resume_refuses_settings_that_change_the_data_or_the_update(tmp_path, key, value):
    """The masks of loader-masked shards and the synthetic source's rows are the data; the clipping threshold is
    part of every update. They were not compared with the checkpoint's config."""
    synthetic = key.startswith("data.synthetic")
    data = "synthetic" if synthetic else tmp_path / "dyn"
    saved = tiny_config(data, tmp_path / "run")  # checked against the config alone: no shard is read
    found = ckpt.save_checkpoint(tmp_path / "ckpts", 2, lambda p: p.mkdir(), {}, {"config": asdict(saved)})
    loop.check_resume(saved, found, False, DistInfo())  # unchanged: resumes
    with pytest.raises(UserError, match=f"{key} .* -> {value}"):
        loop.check_resume(tiny_config(data, tmp_path / "run", **{key: value}), found, False, DistInfo())


def test_a_rank_the_checkpoint_has_no_rng_for_does_not_repeat_rank_0s(shards, tmp_path, capsys):
    """Resumed on more processes than wrote the checkpoint (the lanes, so the data, stay the same), rank 2 took
    rank 0's RNG state: both drew the same dropout masks for the rest of the run, and nothing was said."""
    out = tmp_path / "run"
    cfg = tiny_config(shards, out, **{"train.max_steps": 2, "train.save_every": 2, "model.hidden_dropout": 0.1})
    run_pretrain(cfg)
    saved = ckpt.latest_checkpoint(out / "checkpoints").load_state()["rng"]
    assert len(saved) == 1
    device = torch.device("cpu")
    model, _ = loop.build_model_for(cfg, loop.build_bert_config(cfg, VOCAB), DistInfo())
    optimizer = loop.optimizer_for(model, cfg.optim, "cpu")
    capsys.readouterr()
    for rank in (0, 2):
        info = DistInfo(rank=rank, world_size=4)
        loop.restore(cfg, out / "checkpoints", True, model, optimizer, dev.grad_scaler(device, "fp32"), device, info)
        assert torch.equal(torch.get_rng_state(), saved[0]["cpu"]) == (rank == 0)  # rank 0: its own state
    said = [x for x in capsys.readouterr().out.splitlines() if "written by" in x]
    one_line(said[0], "written by 1 process and this run has 4 processes", "the random draws (dropout) do not")


def test_phase_2_from_a_run_dir_needs_the_phase_finished(shards, tmp_path, capsys):
    """A phase 1 stopped by train.stop_after_steps exits 0, so a phase-2 job chained on it (sbatch
    --dependency=afterok) started from a partly trained phase 1 without a word. Naming the step directory
    itself starts from it on purpose."""
    one = tmp_path / "one"
    assert main(_argv(shards, one, **{"train.max_steps": 4, "train.stop_after_steps": 2})) == 0
    capsys.readouterr()
    two = {"train.max_steps": 2, "train.init_checkpoint": one}
    assert main(_argv(shards, tmp_path / "two", **two)) == 2
    one_line(capsys.readouterr().err, f"train.init_checkpoint {one}", "step 2 of its 4", "--resume")
    step_dir = ckpt.latest_checkpoint(one / "checkpoints").path
    assert main(_argv(shards, tmp_path / "two", **{**two, "train.init_checkpoint": step_dir})) == 0


def test_a_checkpoint_half_deleted_by_keep_last_is_not_listed(tmp_path, monkeypatch):
    """keep_last deleted the oldest checkpoint in place: killed half-way, it left a step directory with its
    meta.json but not its training state, listed as complete (and taken by --resume once the newer ones are
    deleted, as a damaged newest checkpoint's message tells the user to do)."""

    def write(path: Path) -> None:
        path.mkdir()

    for step in (1, 2):
        ckpt.save_checkpoint(tmp_path, step, write, {"step": step}, {}, keep_last=2)

    def killed(path, *args, **kwargs) -> None:
        (Path(path) / ckpt.STATE_FILE).unlink()  # the first file gone, then the kill
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(tmp_path, 3, write, {"step": 3}, {}, keep_last=2)
    monkeypatch.undo()
    assert [c.step for c in ckpt.list_checkpoints(tmp_path)] == [2, 3]
    assert all((c.path / ckpt.STATE_FILE).is_file() for c in ckpt.list_checkpoints(tmp_path))
    ckpt.save_checkpoint(tmp_path, 4, write, {"step": 4}, {}, keep_last=2)  # the next save clears what was left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000003", "step_00000004"]


def test_a_training_state_with_counters_this_version_does_not_know_is_one_line(shards, tmp_path, capsys):
    """A checkpoint written by a newer bertforge (a counter added to TrainState) stopped --resume with
    `TypeError: TrainState.__init__() got an unexpected keyword argument`."""
    run = tmp_path / "run"
    assert main(_argv(shards, run, **{"train.max_steps": 2, "train.save_every": 2})) == 0
    state_file = ckpt.latest_checkpoint(run / "checkpoints").path / ckpt.STATE_FILE
    saved = torch.load(state_file, weights_only=True)
    saved["train_state"]["future_counter"] = 1
    torch.save(saved, state_file)
    capsys.readouterr()
    assert (
        main([*_argv(shards, run, **{"train.max_steps": 4, "train.save_every": 2}), "--resume", "--allow-changed"]) == 2
    )
    one_line(capsys.readouterr().err, "its training state holds future_counter, which this version of bertforge")
