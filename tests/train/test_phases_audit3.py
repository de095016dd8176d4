"""Two-phase pre-training (NVIDIA's phase 1 -> phase 2): what a phase-2 start refuses, in one line, before the
first step and before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.train.conftest import VOCAB, tiny_config

from bertforge.errors import UserError
from bertforge.train import checkpoint as ckpt
from bertforge.train.loop import run_pretrain

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _vocab(path: Path, words: list[str]) -> Path:
    path.mkdir(parents=True)
    (path / "vocab.txt").write_text("\n".join(SPECIAL + words) + "\n")
    return path / "vocab.txt"


@pytest.fixture
def phase1(shards, tmp_path) -> Path:
    """A finished 2-step phase 1 trained with a vocab of VOCAB rows (its checkpoint ships that vocab)."""
    words = [f"w{i}" for i in range(VOCAB - len(SPECIAL))]
    vocab = _vocab(tmp_path / "vocab_a", words)
    run_pretrain(tiny_config(shards, tmp_path / "p1", **{"train.max_steps": 2, "data.vocab": str(vocab)}))
    return tmp_path / "p1"


def test_phase2_with_another_vocab_is_refused_before_anything_is_written(shards, tmp_path, phase1):
    """Phase-2 shards built with another vocab of the same size ran on phase 1's embeddings, every id now meaning
    another word, and shipped the other vocab.txt with phase 1's weights: no error, no warning."""
    words = [f"w{i}" for i in range(VOCAB - len(SPECIAL))][::-1]  # the same tokens, other ids
    other = _vocab(tmp_path / "vocab_b", words)
    out = tmp_path / "p2"
    cfg = tiny_config(
        shards, out, **{"train.max_steps": 1, "train.init_checkpoint": str(phase1), "data.vocab": str(other)}
    )
    with pytest.raises(UserError, match="vocab") as e:
        run_pretrain(cfg)
    msg = str(e.value)
    assert "\n" not in msg and str(other) in msg and "train.init_checkpoint" in msg, msg
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()


def test_phase2_with_phase1s_vocab_starts(shards, tmp_path, phase1):
    """The same vocab, named by another path (a copy), is no change."""
    words = [f"w{i}" for i in range(VOCAB - len(SPECIAL))]
    copy = _vocab(tmp_path / "vocab_copy", words)
    cfg = tiny_config(
        shards, tmp_path / "p2", **{"train.max_steps": 1, "train.init_checkpoint": str(phase1), "data.vocab": str(copy)}
    )
    assert run_pretrain(cfg)["phase"] == 2


def test_init_checkpoint_naming_a_model_directory_says_what_to_set(shards, tmp_path, phase1):
    """A Hugging Face model directory (or a checkpoint's model/) given as train.init_checkpoint was 'no complete
    checkpoint ... (expected step_N/ directories holding meta.json)', with no word of model.init_from, the setting
    that starts from such weights."""
    model_dir = ckpt.latest_checkpoint(phase1 / "checkpoints").model_dir
    hf = tmp_path / "hf_model"
    hf.mkdir()
    for f in model_dir.iterdir():
        (hf / f.name).write_bytes(f.read_bytes())
    cfg = tiny_config(shards, tmp_path / "p2", **{"train.max_steps": 1, "train.init_checkpoint": str(hf)})
    with pytest.raises(UserError, match="model.init_from") as e:
        run_pretrain(cfg)
    assert "\n" not in str(e.value)
    # our own checkpoint's model/ directory: name its step directory, which holds the optimizer moments too
    cfg = tiny_config(shards, tmp_path / "p3", **{"train.max_steps": 1, "train.init_checkpoint": str(model_dir)})
    with pytest.raises(UserError, match=str(model_dir.parent)):
        run_pretrain(cfg)


def test_resume_with_another_vocab_is_refused(shards, tmp_path):
    """Shards without a manifest record no vocab, so --resume took any data.vocab: the rest of the run trained the
    saved embeddings on ids of other words."""
    words = [f"w{i}" for i in range(VOCAB - len(SPECIAL))]
    vocab, other = _vocab(tmp_path / "vocab_a", words), _vocab(tmp_path / "vocab_b", words[::-1])
    out = tmp_path / "run"
    run_pretrain(tiny_config(shards, out, **{"train.stop_after_steps": 3, "data.vocab": str(vocab)}))
    with pytest.raises(UserError, match="--resume: checkpoint .* was trained with the vocab"):
        run_pretrain(tiny_config(shards, out, **{"data.vocab": str(other)}), resume=True)
    assert run_pretrain(tiny_config(shards, out, **{"data.vocab": str(vocab)}), resume=True)["step"] == 6
