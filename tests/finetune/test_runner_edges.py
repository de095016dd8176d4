"""Edges of the fine-tuning loop a Hugging Face run_glue/run_qa user trips on: train.max_steps above what the
epochs give, and an earlier stopped attempt's interrupted/ left beside the finished run of the same fine-tune."""

from __future__ import annotations

import json
import shutil

from bertforge.cli import main


def test_max_steps_above_the_epochs_updates_is_said(encoder, finetune_argv, tmp_path, capsys):
    """Hugging Face's max_steps overrides the epochs; here the shorter decides (32 rows, batch 8, 1 epoch: 4
    updates), so a larger max_steps is named in one line instead of being cut short silently."""
    out = tmp_path / "out"
    assert main(finetune_argv(encoder, tmp_path, out, "sst2", "train.epochs=1", "train.max_steps=100")) == 0
    said = capsys.readouterr().out
    assert "train.max_steps 100 is more than the 4 updates of train.epochs 1 (32 rows, global batch 8)" in said
    assert json.loads((out / "summary.json").read_text())["history"][-1]["step"] == 4
    # a max_steps within the epochs cuts the run short, with no notice
    assert main(finetune_argv(encoder, tmp_path, tmp_path / "b", "sst2", "train.epochs=1", "train.max_steps=3")) == 0
    said = capsys.readouterr().out
    assert "train.max_steps" not in said
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["history"][-1]["step"] == 3


def test_a_finished_rerun_deletes_the_earlier_attempts_interrupted(encoder, finetune_argv, tmp_path, capsys):
    """A stopped run leaves interrupted/ and no summary.json; the same fine-tune run again to the end must not
    leave that older model beside its own best/, where it reads as this run's stop."""
    out = tmp_path / "out"
    argv = finetune_argv(encoder, tmp_path, out, "sst2", "train.epochs=1")
    assert main(argv) == 0
    # the state a SIGTERM leaves (test_sigterm_saves_interrupted_and_exits): interrupted/, no summary.json
    (out / "summary.json").unlink()
    shutil.copytree(out / "best", out / "interrupted")
    capsys.readouterr()
    assert main(argv) == 0
    assert f"deleted {out / 'interrupted'}, the model of an earlier stopped attempt" in capsys.readouterr().out
    assert not (out / "interrupted").exists() and (out / "best" / "model.safetensors").is_file()
    assert (out / "summary.json").is_file()


def test_padded_squad_on_cuda_runs_sdpa_for_the_references_loss():
    """pad_to_max_length on SQuAD promises Google's and HF's loss: a softmax over the padded row, padding's logits
    from padding tokens that attend to the real ones. CUDA's auto unpads (padding's logits: the bias alone) or runs
    the segmented layout (padding attends to itself), so that run takes SDPA with the padding mask, and says so."""
    from types import SimpleNamespace

    import torch

    from bertforge.config import load_config
    from bertforge.finetune.runner import _padded_qa_attention

    padded = load_config("finetune", None, ["train.pad_to_max_length=true"])
    said: list[str] = []
    out = _padded_qa_attention(padded, SimpleNamespace(task="squad_v2"), torch.device("cuda"), said.append)
    assert out.train.attention == "sdpa" and "sdpa" in said[0]
    plain = load_config("finetune")
    for cfg, task, device in ((padded, "mrpc", "cuda"), (padded, "squad", "cpu"), (plain, "squad", "cuda")):
        assert _padded_qa_attention(cfg, SimpleNamespace(task=task), torch.device(device), said.append) is cfg
    chosen = load_config("finetune", None, ["train.pad_to_max_length=true", "train.attention=eager"])
    assert _padded_qa_attention(chosen, SimpleNamespace(task="squad"), torch.device("cuda"), said.append) is chosen


def test_the_presets_micro_batch_becomes_each_processs_share_on_several():
    """The presets' micro-batch is the global 32 (one device): on 8 processes (docs/finetuning.md's torchrun line)
    it was refused at start; each process takes its share whole, the same update, and says so."""
    import pytest

    from bertforge.config import load_config
    from bertforge.errors import UserError
    from bertforge.finetune.runner import _fit_micro_batch

    said: list[str] = []
    squad = load_config("finetune", "squad_large_384")
    assert _fit_micro_batch(squad, 8, said.append).train.micro_batch_size == 4 and "4, each process" in said[0]
    assert _fit_micro_batch(squad, 1, said.append).train.micro_batch_size == squad.train.micro_batch_size
    small = load_config("finetune", None, ["train.global_batch_size=32", "train.micro_batch_size=2"])
    assert _fit_micro_batch(small, 8, said.append) == small  # 2 x 8 divides 32: as set
    with pytest.raises(UserError, match="must be a multiple of train.micro_batch_size 32 x 3 processes"):
        _fit_micro_batch(load_config("finetune"), 3, said.append)
