"""Resume and profiler audit (train/loop.py, train/checkpoint.py, runtime/profile.py): a resume (and phase 2's
first start) reads only the weights of the checkpoint it starts from, never model.init_from's; a loop that raises
inside the --profile window stops torch.profiler; a stop and resume reproduces the uninterrupted run bitwise on
packed, dynamically masked and MLM-only shards, with accumulation, and after a SIGTERM in an accumulation window."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from tests.train.conftest import logged_losses, make_shards, saved_weights, tiny_config

from bertforge.cli import main
from bertforge.errors import UserError
from bertforge.model import hf_interop
from bertforge.runtime.preempt import Preempted
from bertforge.train import checkpoint as ckpt
from bertforge.train import loop
from bertforge.train.loop import run_pretrain

FEW = {"train.max_steps": 2, "train.save_every": 1, "train.global_batch_size": 4}


@pytest.fixture
def shards(tmp_path) -> Path:
    return make_shards(tmp_path / "shards", n_shards=1, rows=16)


@pytest.fixture
def reads(monkeypatch) -> list[Path]:
    """The weight files read (hf_interop.read_state_dict: load_pretrained's and restore's reader)."""
    seen: list[Path] = []
    real = hf_interop.read_state_dict

    def spy(path, *args, **kwargs):
        seen.append(Path(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(hf_interop, "read_state_dict", spy)
    return seen


def _init_from(shards: Path, tmp_path: Path) -> Path:
    """A model directory to start from (a tiny run's checkpoint), copied out of its run."""
    run_pretrain(tiny_config(shards, tmp_path / "source_run", **{**FEW, "train.max_steps": 1}))
    src = tmp_path / "init_from"
    shutil.copytree(ckpt.latest_checkpoint(tmp_path / "source_run" / "checkpoints").model_dir, src)
    return src


def _same(a: Path, b: Path) -> None:
    wa, wb = saved_weights(a), saved_weights(b)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_resume_reads_its_checkpoints_weights_not_init_froms(shards, tmp_path, reads):
    """--resume with model.init_from read init_from's weights and then the checkpoint's over them: wasted, and an
    init_from damaged (or replaced) since stopped the resume although the checkpoint holds every weight."""
    src = _init_from(shards, tmp_path)
    extra = {**FEW, "model.init_from": str(src)}
    run_pretrain(tiny_config(shards, tmp_path / "full", **extra))
    run_pretrain(tiny_config(shards, tmp_path / "split", **extra, **{"train.stop_after_steps": 1}))
    (src / "model.safetensors").write_bytes(b"not a safetensors file")
    reads.clear()
    assert run_pretrain(tiny_config(shards, tmp_path / "split", **extra), resume=True)["step"] == 2
    assert reads == [tmp_path / "split" / "checkpoints" / "step_00000001" / "model" / "model.safetensors"]
    _same(tmp_path / "full", tmp_path / "split")
    assert logged_losses(tmp_path / "full") == logged_losses(tmp_path / "split")


def test_phase_2_reads_the_init_checkpoint_and_not_init_from(shards, tmp_path, reads):
    """Phase 2 keeping phase 1's model.init_from and naming train.init_checkpoint: its first start reads the init
    checkpoint's weights alone (init_from's were read and overwritten), and trains as without init_from."""
    src = _init_from(shards, tmp_path)
    run_pretrain(tiny_config(shards, tmp_path / "p1", **FEW, **{"model.init_from": str(src)}))
    (src / "model.safetensors").write_bytes(b"not a safetensors file")
    p2 = {**FEW, "train.init_checkpoint": str(tmp_path / "p1")}
    reads.clear()
    run_pretrain(tiny_config(shards, tmp_path / "p2", **p2, **{"model.init_from": str(src)}))
    assert reads == [tmp_path / "p1" / "checkpoints" / "step_00000002" / "model" / "model.safetensors"]
    run_pretrain(tiny_config(shards, tmp_path / "p2_plain", **p2))
    _same(tmp_path / "p2", tmp_path / "p2_plain")
    assert logged_losses(tmp_path / "p2") == logged_losses(tmp_path / "p2_plain")


def test_a_loop_that_raises_inside_the_profile_window_stops_the_profiler(shards, tmp_path, monkeypatch):
    """run_pretrain(profile_steps=N) from Python: an error in the loop (here the second step, inside the window)
    left torch.profiler recording every op of the process, and the next profiled run failed to start it."""
    real, calls = loop.train_step, []
    closed: list[bool] = []
    real_close = loop.MetricsLogger.close

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise UserError("a damaged shard")
        return real(*args, **kwargs)

    def close(self):
        closed.append(True)
        real_close(self)

    monkeypatch.setattr(loop, "train_step", failing)
    monkeypatch.setattr(loop.MetricsLogger, "close", close)
    cfg = tiny_config(shards, tmp_path / "run", **{**FEW, "train.max_steps": 4})
    with pytest.raises(UserError, match="a damaged shard"):
        run_pretrain(cfg, profile_steps=2)
    assert not torch.autograd.profiler._is_profiler_enabled
    assert closed  # metrics.jsonl closed too (and the power sampler's thread stopped on a GPU)
    monkeypatch.setattr(loop, "train_step", real)
    run_pretrain(tiny_config(shards, tmp_path / "again", **{**FEW, "train.max_steps": 4}), profile_steps=2)
    assert (tmp_path / "again" / "profile" / "trace.json").is_file()


# ------------------------------------------------------------------------------------------- exact resume
@pytest.fixture(scope="module")
def real_shards(demo_mlm, tmp_path_factory) -> dict[str, Path]:
    """Sentence-pair shards of the demo's documents and vocab (one document file, seq 64), statically masked and
    packed by `bertforge pack`, and dynamically masked (masked in the loader); the demo's MLM-only shards."""
    root = tmp_path_factory.mktemp("resume_audit3")
    base = ["data", "shards", "--docs", str(demo_mlm / "docs" / "docs_0.txt"), "--vocab", str(demo_mlm / "vocab")]
    base += ["--seq-len", "64", "--max-pred", "10", "--dupe-factor", "1", "--shards", "1", "--workers", "1"]
    assert main([*base, "--out", str(root / "static")]) == 0
    assert main([*base, "--out", str(root / "dynamic"), "--dynamic-masking"]) == 0
    assert main(["pack", "--in", str(root / "static"), "--out", str(root / "packed")]) == 0
    return {"packed": root / "packed", "dynamic": root / "dynamic", "mlm": demo_mlm / "shards_mlm"}


REAL = {"model.vocab_size": "null", "model.max_position_embeddings": 128, "train.max_steps": 3, "train.save_every": 3}
REAL |= {"train.global_batch_size": 4, "train.micro_batch_size": 2}  # 2 micro-batches per update


@pytest.mark.parametrize(
    ("kind", "extra"),
    [
        ("packed", {"model.hidden_dropout": 0.1, "model.attention_dropout": 0.1}),
        ("dynamic", {}),
        ("dynamic", {"data.pack_per_row": 3}),
        ("mlm", {"train.objective": "mlm"}),
    ],
)
def test_a_stopped_and_resumed_run_is_the_uninterrupted_one(real_shards, tmp_path, kind, extra):
    """Stopped after step 1 (train.stop_after_steps) and resumed: weights, losses, optimizer moments and counters
    as in the uninterrupted run, bitwise (CPU, fp32), whatever the shards (masks drawn in the loader, packed rows,
    rows packed on the fly, MLM-only) and with dropout."""
    data, extra = real_shards[kind], {**REAL, **extra}
    run_pretrain(tiny_config(data, tmp_path / "full", **extra))
    assert run_pretrain(tiny_config(data, tmp_path / "split", **extra, **{"train.stop_after_steps": 1}))["step"] == 1
    run_pretrain(tiny_config(data, tmp_path / "split", **extra), resume=True)
    _same(tmp_path / "full", tmp_path / "split")
    assert logged_losses(tmp_path / "full") == logged_losses(tmp_path / "split")
    a, b = (ckpt.latest_checkpoint(tmp_path / r / "checkpoints").load_state() for r in ("full", "split"))
    for i, st in a["optimizer"]["state"].items():
        assert all(torch.equal(v, b["optimizer"]["state"][i][k]) for k, v in st.items() if torch.is_tensor(v))
    drop = lambda s: {k: v for k, v in s["train_state"].items() if k != "train_seconds"}  # noqa: E731
    assert drop(a) == drop(b)


def test_a_sigterm_inside_an_accumulation_window_saves_the_step_and_resumes_exactly(shards, tmp_path, monkeypatch):
    """SIGTERM while the second update's first micro-batch runs: that update finishes, its checkpoint is saved
    (between two log lines, keep_last 1 pruning the step before), and the resume matches the uninterrupted run."""
    extra = {"train.max_steps": 4, "train.save_every": 1, "train.keep_last": 1, "train.log_every": 3}
    extra |= {"train.global_batch_size": 8, "train.micro_batch_size": 2}
    run_pretrain(tiny_config(shards, tmp_path / "full", **extra))
    real, calls = loop.train_step, []

    def signalled(step, batches, *args, **kwargs):
        calls.append(1)

        def first_then_signal():
            for i, batch in enumerate(batches):
                if len(calls) == 2 and i == 1:
                    os.kill(os.getpid(), signal.SIGTERM)
                yield batch

        return real(step, first_then_signal(), *args, **kwargs)

    monkeypatch.setattr(loop, "train_step", signalled)
    with pytest.raises(Preempted):
        run_pretrain(tiny_config(shards, tmp_path / "split", **extra))
    assert [c.step for c in ckpt.list_checkpoints(tmp_path / "split" / "checkpoints")] == [2]
    monkeypatch.setattr(loop, "train_step", real)
    run_pretrain(tiny_config(shards, tmp_path / "split", **extra), resume=True)
    _same(tmp_path / "full", tmp_path / "split")
    full, split = logged_losses(tmp_path / "full"), logged_losses(tmp_path / "split")
    assert sorted(split) == [2, 3, 4] and split[4] == full[4]  # the stop logs steps 1-2 as a row of their own
