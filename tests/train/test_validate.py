"""What pre-training checks before its first step against what the files record (issue 20, classes 2 and 3):
data.vocab against the shards' vocab hash, --resume against the checkpoint's config; and the files it reads
that can be damaged — shards, model.safetensors — or a disk that fills while it saves, each one line."""

from __future__ import annotations

import errno
import hashlib
import json
from pathlib import Path

import h5py
import pytest
import torch
from tests.helpers import one_line

from bertforge.cli import main
from bertforge.train import checkpoint as ckpt


def _argv(overrides, shards: Path, out: Path, *flags: str, **extra) -> list[str]:
    return ["pretrain", *[f"--set={s}" for s in overrides(shards, out, **extra)], *flags]


def _vocab(path: Path, words: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    return path


def test_a_data_vocab_other_than_the_shards_is_refused_at_start_up(shards, tmp_path, overrides, capsys):
    built_with = _vocab(tmp_path / "v1" / "vocab.txt", [f"w{i}" for i in range(59)])
    other = _vocab(tmp_path / "v2" / "vocab.txt", [f"x{i}" for i in range(59)])
    manifest = {"vocab": str(built_with), "vocab_sha256": hashlib.sha256(built_with.read_bytes()).hexdigest()}
    (shards / "manifest.json").write_text(json.dumps({**manifest, "vocab_size": 64}))
    out = tmp_path / "run"
    capsys.readouterr()
    assert main(_argv(overrides, shards, out, **{"data.vocab": other, "train.max_steps": 1})) == 2
    one_line(capsys.readouterr().err, other, built_with, "data.vocab")
    assert not out.exists()  # refused before step 1: the directory this run created is gone again
    assert main(_argv(overrides, shards, tmp_path / "ok", **{"data.vocab": built_with, "train.max_steps": 1})) == 0
    saved = ckpt.latest_checkpoint(tmp_path / "ok" / "checkpoints")
    assert (saved.model_dir / "vocab.txt").read_bytes() == built_with.read_bytes()


def test_resume_with_a_changed_batch_data_or_schedule_is_refused_unless_allowed(shards, tmp_path, overrides, capsys):
    out = tmp_path / "run"
    assert main(_argv(overrides, shards, out, **{"train.max_steps": 3})) == 0
    other = tmp_path / "other_shards"
    other.symlink_to(shards)  # the same files under another name: not a change
    changes = {
        "train.global_batch_size": 16,
        "train.micro_batch_size": 2,
        "train.seed": 7,
        "data.chunk_rows": 16,
        "optim.lr": 0.002,
        "optim.warmup": 0.5,
        "optim.schedule": "linear",
        "train.max_steps": 6,
    }
    for key, value in changes.items():
        capsys.readouterr()
        assert main(_argv(overrides, shards, out, "--resume", **{"train.max_steps": 3, key: value})) == 2, key
        line = one_line(capsys.readouterr().err, "--resume", key, "--allow-changed")
        assert f"-> {value}" in line
    assert main(_argv(overrides, other, out, "--resume", **{"train.max_steps": 3})) == 0
    # the warmup-stable-decay schedule's own keys are part of the learning-rate curve too
    wsd = {"train.max_steps": 3, "optim.schedule": "wsd", "optim.warmup": 0.2}
    assert main(_argv(overrides, shards, tmp_path / "wsd", **wsd)) == 0
    for key, value in (("optim.decay", 0.3), ("optim.decay_shape", "1-sqrt")):
        assert main(_argv(overrides, shards, tmp_path / "wsd", "--resume", **{**wsd, key: value})) == 2, key
        assert f"{key} " in one_line(capsys.readouterr().err, "--resume", f"-> {value}")
    # ... and only its: a run of another schedule that recorded a decay (ignored then, refused now) resumes
    meta = ckpt.latest_checkpoint(out / "checkpoints").path / "meta.json"
    recorded = json.loads(meta.read_text())
    recorded["config"]["optim"]["decay"] = 0.2
    meta.write_text(json.dumps(recorded))
    assert main(_argv(overrides, shards, out, "--resume", **{"train.max_steps": 3})) == 0
    # the data lanes (micro-batches per update over all ranks): packed rows per update round to micro x
    # processes, so another process count can change them, and with them the data order
    recorded["lanes"] += 1
    meta.write_text(json.dumps(recorded))
    assert main(_argv(overrides, shards, out, "--resume", **{"train.max_steps": 3})) == 2
    lanes = recorded["lanes"]  # on as many processes: the rows per update changed, not the process count
    one_line(capsys.readouterr().err, f"data lanes {lanes} -> {lanes - 1} (rows per update: train.micro_batch_size")
    written_by = recorded.get("world_size")
    recorded["world_size"] = 2  # written by 2 processes: that is what to restore
    meta.write_text(json.dumps(recorded))
    assert main(_argv(overrides, shards, out, "--resume", **{"train.max_steps": 3})) == 2
    one_line(capsys.readouterr().err, f"data lanes {lanes} -> {lanes - 1} (2 -> 1 processes: run on 2 to keep them)")
    recorded["world_size"], recorded["lanes"] = written_by, lanes - 1
    meta.write_text(json.dumps(recorded))
    moved = tmp_path / "moved"
    moved.mkdir()
    for p in shards.iterdir():
        (moved / p.name).write_bytes(p.read_bytes())
    assert main(_argv(overrides, moved, out, "--resume", **{"train.max_steps": 3})) == 2
    one_line(capsys.readouterr().err, "data.input_dir", moved)
    assert main(_argv(overrides, shards, out, "--allow-changed", **{"train.max_steps": 3})) == 2  # needs --resume
    one_line(capsys.readouterr().err, "--allow-changed", "--resume")
    argv = _argv(overrides, shards, out, "--resume", "--allow-changed", **{"train.max_steps": 6, "optim.lr": 0.002})
    assert main(argv) == 0
    assert "--allow-changed: resuming" in capsys.readouterr().out
    assert ckpt.latest_checkpoint(out / "checkpoints").step == 6


def test_another_optimizer_is_refused_on_resume_and_starts_afresh_in_a_new_phase(shards, tmp_path, overrides, capsys):
    """LAMB's saved moments cannot become AdamW's: --resume refuses the change (even --allow-changed), a phase
    from train.init_checkpoint loads the weights and starts the optimizer afresh, both ways."""
    lamb, adamw = tmp_path / "lamb", tmp_path / "adamw"
    assert main(_argv(overrides, shards, lamb, **{"train.max_steps": 4, "train.stop_after_steps": 3})) == 0
    for flags in (("--resume",), ("--resume", "--allow-changed")):
        capsys.readouterr()
        assert main(_argv(overrides, shards, lamb, *flags, **{"train.max_steps": 4, "optim.name": "adamw"})) == 2
        one_line(capsys.readouterr().err, "--resume", "lamb", "optim.name=lamb", "train.init_checkpoint")
    unfinished = ckpt.latest_checkpoint(lamb / "checkpoints").path  # named as such: a phase from a stopped one
    phase2 = {"train.max_steps": 2, "train.init_checkpoint": unfinished, "optim.name": "adamw"}
    assert main(_argv(overrides, shards, adamw, **phase2)) == 0
    assert "weights loaded; its lamb moments not (adamw starts afresh)" in capsys.readouterr().out
    back = {"train.max_steps": 2, "train.init_checkpoint": adamw, "optim.name": "lamb"}
    assert main(_argv(overrides, shards, tmp_path / "lamb2", **back)) == 0


def test_a_checkpoint_of_another_model_size_is_one_line_naming_the_settings(shards, tmp_path, overrides, capsys):
    out = tmp_path / "run"
    assert main(_argv(overrides, shards, out, **{"train.max_steps": 4, "train.stop_after_steps": 2})) == 0
    capsys.readouterr()
    assert main(_argv(overrides, shards, out, "--resume", **{"train.max_steps": 4, "model.preset": "mini"})) == 2
    one_line(capsys.readouterr().err, "holds another model: hidden_size 128 (this run: 256)", "model.preset")
    phase2 = {"train.max_steps": 2, "train.init_checkpoint": out, "model.max_position_embeddings": 32}
    assert main(_argv(overrides, shards, tmp_path / "p2", **phase2)) == 2
    one_line(capsys.readouterr().err, "max_position_embeddings 64 (this run: 32)")


def test_synthetic_ids_beyond_the_models_vocab_are_refused_at_start_up(tmp_path, overrides, capsys):
    out = tmp_path / "run"
    synthetic = {"data.input_dir": "synthetic", "data.synthetic_seq_len": 32, "data.synthetic_max_pred": 5}
    assert main(_argv(overrides, tmp_path, out, **synthetic, **{"data.synthetic_vocab_size": 1000})) == 2
    one_line(capsys.readouterr().err, "data.synthetic_vocab_size 1000", "vocab of 64", "data.synthetic_vocab_size=64")
    assert not out.exists()


def _flip_chunk(path: Path, dataset: str = "input_ids") -> None:
    with h5py.File(path, "r") as f:
        info = f[dataset].id.get_chunk_info(0)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(b"\xff" * 16)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_damaged_shard_is_one_line_in_pretrain(shards, tmp_path, overrides, capsys, workers):
    for p in shards.glob("*.hdf5"):
        _flip_chunk(p)
    assert main(_argv(overrides, shards, tmp_path / "run", **{"data.num_workers": workers})) == 2
    one_line(capsys.readouterr().err, "shard", str(shards), "corrupt")


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_model_safetensors_is_one_line_in_resume_and_export(shards, tmp_path, overrides, capsys, damage):
    out = tmp_path / "run"
    assert main(_argv(overrides, shards, out, **{"train.max_steps": 6, "train.stop_after_steps": 3})) == 0
    weights = ckpt.latest_checkpoint(out / "checkpoints").model_dir / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x07garbage" * 50)
    capsys.readouterr()
    assert main(_argv(overrides, shards, out, "--resume", **{"train.max_steps": 6})) == 2
    # --resume's advice: the checkpoint before it (not "restore it or export again")
    one_line(capsys.readouterr().err, weights, "safetensors", f"delete {weights.parent.parent} to resume from")
    model_dir = weights.parent
    assert main(["export", "--model", str(model_dir), "--format", "hf", "--out", str(tmp_path / "exp")]) == 2
    one_line(capsys.readouterr().err, weights, "safetensors")
    from bertforge.errors import UserError
    from bertforge.model.hf_interop import load_pretrained

    # the one loader that finetune --model and serve use too
    with pytest.raises(UserError, match=f"{weights}: not a readable safetensors file"):
        load_pretrained(model_dir, "classification", num_labels=2, allow_missing_head=True)


def test_a_full_disk_while_saving_a_checkpoint_keeps_the_earlier_one(shards, tmp_path, overrides, monkeypatch, capsys):
    out = tmp_path / "run"
    real_save, calls = torch.save, {"n": 0}

    def fills_on_the_second_save(obj, f, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            f.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *a, **kw)

    monkeypatch.setattr(ckpt.torch, "save", fills_on_the_second_save)
    assert main(_argv(overrides, shards, out, **{"train.max_steps": 6, "train.save_every": 3})) == 2
    one_line(capsys.readouterr().err, "no space left", out / "checkpoints")
    monkeypatch.setattr(ckpt.torch, "save", real_save)
    kept = ckpt.latest_checkpoint(out / "checkpoints")
    assert kept.step == 3 and kept.load_state()["train_state"]["step"] == 3
    assert [p.name for p in (out / "checkpoints").iterdir()] == [kept.path.name]  # no temporary directory


def test_a_real_full_disk_while_saving_keeps_the_earlier_checkpoint(shards, overrides, capfd, small_tmpfs):
    """On a 9 MiB tmpfs one checkpoint of the tiny model fits (about 5 MiB), the second does not."""
    out = small_tmpfs("9m") / "run"
    argv = _argv(overrides, shards, out, **{"train.max_steps": 30, "train.save_every": 3, "train.keep_last": 9})
    capfd.readouterr()
    assert main(argv) == 2
    one_line(capfd.readouterr().err, "no space left", out / "checkpoints" / "step_00000006")
    kept = ckpt.latest_checkpoint(out / "checkpoints")
    assert kept.step == 3 and kept.load_state()["train_state"]["step"] == 3
    assert [p.name for p in (out / "checkpoints").iterdir()] == [kept.path.name]
