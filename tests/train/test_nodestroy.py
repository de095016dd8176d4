"""Nothing of an earlier run is lost or misreported: output_dir refusal, --overwrite, resume of a finished run,
metrics without repeated steps, and SIGTERM/SIGINT stopping with a checkpoint that --resume continues exactly."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tests.train.conftest import saved_weights

import bertforge
from bertforge.cli import main
from bertforge.config import load_config
from bertforge.errors import UserError
from bertforge.runtime.preempt import Preempted, Preemption
from bertforge.train import checkpoint as ckpt
from bertforge.train.loop import run_pretrain


def _steps(run: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = saved_weights(a), saved_weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def test_pretrain_refuses_an_earlier_run_and_overwrite_starts_afresh(shards, tmp_path, overrides, capsys):
    out = tmp_path / "run"
    argv = ["pretrain", *[f"--set={s}" for s in overrides(shards, out, **{"train.max_steps": 3})]]
    assert main(argv) == 0
    before = (out / "metrics.jsonl").read_text()
    (out / "config.yaml").write_text("# the earlier run's config\n")
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "--resume" in err and "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert (out / "metrics.jsonl").read_text() == before  # untouched, config.yaml too
    assert (out / "config.yaml").read_text() == "# the earlier run's config\n"
    assert main([*argv, "--resume", "--overwrite"]) == 2
    old = ckpt.latest_checkpoint(out / "checkpoints").path
    (old / "marker").write_text("x")
    assert main([*argv, "--overwrite"]) == 0
    assert "deleted the earlier run's checkpoints" in capsys.readouterr().out
    assert not (old / "marker").exists() and _steps(out) == [1, 2, 3]
    with pytest.raises(UserError, match="--overwrite"):  # the Python API refuses too
        run_pretrain(load_config("pretrain", None, overrides(shards, out)))


def test_a_refused_start_leaves_the_earlier_run_and_its_config_as_they_were(shards, tmp_path, overrides, capsys):
    """--overwrite deletes only once the new run's inputs have passed their checks; a refused --resume does not
    rewrite config.yaml with the config it refused."""
    out = tmp_path / "run"
    argv = ["pretrain", *[f"--set={s}" for s in overrides(shards, out, **{"train.max_steps": 3})]]
    assert main(argv) == 0
    config, metrics = (out / "config.yaml").read_text(), (out / "metrics.jsonl").read_text()
    saved = ckpt.latest_checkpoint(out / "checkpoints").path
    capsys.readouterr()
    assert main([*argv, f"--set=data.eval_dir={tmp_path / 'nope'}", "--overwrite"]) == 2
    assert "nope" in capsys.readouterr().err
    assert main([*argv, "--set=optim.lr=0.5", "--resume"]) == 2
    assert "optim.lr" in capsys.readouterr().err
    assert (out / "config.yaml").read_text() == config and (out / "metrics.jsonl").read_text() == metrics
    assert ckpt.latest_checkpoint(out / "checkpoints").path == saved


def test_checkpoints_and_the_summary_count_the_steps_between_log_lines(shards, tmp_path, overrides):
    """Sequences and tokens are exact in a checkpoint saved between two log lines, and after a stop there
    (train.stop_after_steps) and a resume, as in the uninterrupted run."""
    every = {"train.log_every": 4, "train.save_every": 3}
    full, cut = tmp_path / "full", tmp_path / "cut"
    whole = run_pretrain(load_config("pretrain", None, overrides(shards, full, **every)))
    assert whole["sequences"] == 6 * 8
    meta = json.loads((full / "checkpoints" / "step_00000003" / "meta.json").read_text())
    assert meta["sequences"] == 3 * 8
    run_pretrain(load_config("pretrain", None, overrides(shards, cut, **every, **{"train.stop_after_steps": 3})))
    resumed = run_pretrain(load_config("pretrain", None, overrides(shards, cut, **every)), resume=True)
    assert (resumed["sequences"], resumed["tokens"]) == (whole["sequences"], whole["tokens"])


def test_resume_of_a_finished_run_keeps_the_summary(shards, tmp_path, overrides):
    out = tmp_path / "run"
    cfg = load_config("pretrain", None, overrides(shards, out))
    first = run_pretrain(cfg)
    again = run_pretrain(cfg, resume=True)
    assert first["final_loss"] is not None and first["first_step_s"] is not None
    for key in ("step", "final_loss", "final_mlm_acc", "first_step_s", "model_dir"):
        assert again[key] == first[key], key
    assert json.loads((out / "summary.json").read_text())["final_loss"] == first["final_loss"]
    assert _steps(out) == [1, 2, 3, 4, 5, 6]


def test_metrics_do_not_repeat_steps_after_a_resume_from_an_older_checkpoint(shards, tmp_path, overrides):
    """Killed after step 5 was logged but before it was saved: the resume re-runs 4 and 5 from step 3."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    run_pretrain(load_config("pretrain", None, overrides(shards, full)))
    run_pretrain(load_config("pretrain", None, overrides(shards, cut, **{"train.stop_after_steps": 5})))
    shutil.rmtree(ckpt.latest_checkpoint(cut / "checkpoints").path)  # step 5's checkpoint never made it
    assert ckpt.latest_checkpoint(cut / "checkpoints").path.name == "step_00000003"
    with open(cut / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "lo')  # and a torn last line
    run_pretrain(load_config("pretrain", None, overrides(shards, cut)), resume=True)
    assert _steps(cut) == [1, 2, 3, 4, 5, 6]
    _assert_same_weights(full, cut)


def test_preemption_flag_and_handlers_restored():
    old = signal.getsignal(signal.SIGINT)
    # a signal no step boundary acted on (it came during the final evaluation) still stops the process at the
    # end: it was dropped, and a GLUE suite ran its next tasks and exited 0
    with pytest.raises(Preempted, match="after the last step") as stop, Preemption() as pre:
        signal.raise_signal(signal.SIGINT)  # the handler only records it: no KeyboardInterrupt here
        assert pre.signum == signal.SIGINT and pre.agreed(torch.device("cpu"))
        err = pre.stopped("saved")
        assert str(err) == "received SIGINT: saved" and err.exit_code == 130
    assert stop.value.exit_code == 130
    assert signal.getsignal(signal.SIGINT) is old
    with Preemption() as pre:  # none: nothing raised
        pass


def test_under_a_launcher_a_repeat_is_the_forwarded_copy_and_the_other_signal_stops_at_once(monkeypatch):
    """SLURM signals every process of a step and torchrun forwards its own copy (handled only after a save of any
    length): taken as a second signal, it killed the workers while they saved. Under a launcher the other signal
    stops at once (torchrun sends SIGTERM on a second Ctrl-C); with no launcher, the same one again does."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with Preemption() as pre:
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # the copy: ignored (before: KeyboardInterrupt)
        signal.raise_signal(signal.SIGINT)
        assert pre.signum == signal.SIGINT
        pre.signum = 0  # as if no signal was pending, so the exit raises nothing
    terminated = []
    monkeypatch.setattr(signal, "raise_signal", lambda sig: terminated.append(sig))  # SIGTERM would end pytest
    with Preemption() as pre:
        pre._handle(signal.SIGINT, None)
        pre._handle(signal.SIGTERM, None)  # the other signal: at once
        pre.signum = 0
    assert terminated == [signal.SIGTERM]
    monkeypatch.undo()
    with pytest.raises(KeyboardInterrupt), Preemption() as pre:
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # no launcher: a second signal is the user's


def test_ranks_decide_from_the_reduced_flags_alone(monkeypatch):
    """A signal landing on one rank after the all-reduce made that rank stop while the others went on into the
    next all-reduce (a gloo size mismatch, no checkpoint)."""
    from bertforge.runtime import preempt

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    with Preemption() as pre:

        def reduce_then_signal(flags):
            pre.signum = signal.SIGTERM  # lands here, after the other ranks' flags were summed
            return flags

        monkeypatch.setattr(preempt.ddp, "all_reduce_sum", reduce_then_signal)
        assert not pre.agreed(torch.device("cpu"))  # as the other ranks decide
        monkeypatch.setattr(preempt.ddp, "all_reduce_sum", lambda flags: flags)
        assert pre.agreed(torch.device("cpu"))  # the next step: every rank stops
        pre.signum = 0


def _child(argv: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(Path(bertforge.__file__).parents[1])}
    return subprocess.Popen(
        [sys.executable, "-m", "bertforge", *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_sigterm_saves_a_checkpoint_and_resume_matches_an_uninterrupted_run(shards, tmp_path, overrides):
    extra = {"train.max_steps": 100, "train.save_every": 1000, "train.log_every": 1}
    full, cut = tmp_path / "full", tmp_path / "cut"
    child = _child(["pretrain", *[f"--set={s}" for s in overrides(shards, cut, **extra)]])
    deadline = time.monotonic() + 120
    while not ((cut / "metrics.jsonl").is_file() and _steps(cut)) and child.poll() is None:
        assert time.monotonic() < deadline, "the child logged no step"
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 143, (out, err)
    saved = ckpt.latest_checkpoint(cut / "checkpoints")
    assert saved is not None and 0 < saved.load_state()["train_state"]["step"] < 100
    assert f"received SIGTERM: saved checkpoint {saved.path.name} in {cut / 'checkpoints'}" in err
    assert "continue with --resume" in err
    run_pretrain(load_config("pretrain", None, overrides(shards, cut, **extra)), resume=True)
    run_pretrain(load_config("pretrain", None, overrides(shards, full, **extra)))
    assert sorted(set(_steps(cut))) == _steps(cut)  # no step logged twice
    _assert_same_weights(full, cut)


def test_overwrite_refuses_the_init_checkpoint_it_would_delete(shards, tmp_path, overrides, capsys):
    """`--overwrite` with train.init_checkpoint inside train.output_dir deleted phase 1's checkpoints before phase
    2 had saved anything (and a failing start then left nothing)."""
    out = tmp_path / "run"
    argv = ["pretrain", *[f"--set={s}" for s in overrides(shards, out, **{"train.max_steps": 3})]]
    assert main(argv) == 0
    steps = sorted(p.name for p in (out / "checkpoints").iterdir())
    capsys.readouterr()
    assert main([*argv, f"--set=train.init_checkpoint={out}", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "which --overwrite deletes" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == steps
    # model.init_from (weights only) in the same place: refused too (it was deleted, then replaced by step 2)
    model = out / "checkpoints" / steps[-1] / "model"
    assert main([*argv, f"--set=model.init_from={model}", "--overwrite"]) == 2
    assert f"model.init_from {model} is in train.output_dir" in capsys.readouterr().err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == steps
    # elsewhere in output_dir, where --overwrite deletes nothing: allowed
    import shutil

    kept = shutil.copytree(model, out / "hf_init")
    assert main([*argv, f"--set=model.init_from={kept}", "--overwrite"]) == 0
    assert (kept / "config.json").is_file()


@pytest.mark.parametrize(
    ("key", "value"), [("train.seed", -1), ("train.output_dir", ""), ("train.stop_after_steps", -1)]
)
def test_pretrain_settings_that_failed_late_are_one_line_at_load(shards, tmp_path, overrides, capsys, key, value):
    """A negative seed was a DataLoader traceback at the first step (after --overwrite had deleted the earlier
    run); an empty output_dir wrote the run into the working directory."""
    argv = ["pretrain", *[f"--set={s}" for s in overrides(shards, tmp_path / "run")], f"--set={key}={value}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert key in err and len(err.strip().splitlines()) == 1


def test_phase_two_runs_its_own_optimizer_settings_and_names_another_objective(shards, tmp_path, overrides, capsys):
    """torch's load_state_dict brought back phase 1's weight decay, betas and eps, while config.yaml said
    otherwise; a checkpoint of the other objective was a size-mismatch traceback inside torch."""
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["pretrain", *[f"--set={s}" for s in overrides(shards, one, **{"train.max_steps": 3})]]) == 0
    changed = {"optim.weight_decay": 0.5, "optim.beta2": 0.98, "optim.eps": 1e-8, "train.max_steps": 3}
    sets = [*overrides(shards, two, **changed), f"train.init_checkpoint={one}"]
    argv = ["pretrain", *[f"--set={s}" for s in sets]]
    assert main(argv) == 0
    state = ckpt.latest_checkpoint(two / "checkpoints").load_state()
    groups = state["optimizer"]["param_groups"]
    assert max(g["weight_decay"] for g in groups) == 0.5
    assert {tuple(g["betas"]) for g in groups} == {(0.9, 0.98)} and {g["eps"] for g in groups} == {1e-8}
    capsys.readouterr()
    mlm = overrides(shards, tmp_path / "three", **{"train.objective": "mlm"})
    assert main(["pretrain", *[f"--set={s}" for s in mlm], f"--set=train.init_checkpoint={one}"]) == 2
    err = capsys.readouterr().err
    assert "train.objective=mlm_nsp" in err and len(err.strip().splitlines()) == 1
