"""A checkpoint file that weights_only refuses (a pickle that would run code) is one line naming it, saying it
could not be loaded safely, with advice for where it came from — never torch's advice to load it unsafely."""

from __future__ import annotations

import os

import pytest
import torch

from bertforge.cli import main
from bertforge.errors import UserError
from bertforge.model.hf_interop import read_state_dict
from bertforge.train import checkpoint as ckpt


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _checks(msg: str, path, marker, *parts: str) -> None:
    assert "\n" not in msg and "weights_only" not in msg, msg
    assert f"{path} could not be loaded safely: it is not a plain tensor checkpoint" in msg, msg
    for p in parts:
        assert p in msg, (p, msg)
    assert not marker.exists()  # nothing ran


def _checkpoint(root, marker, write_model=None):
    def no_model(p):
        p.mkdir()

    return ckpt.save_checkpoint(root, 3, write_model or no_model, {"x": _Evil(marker)}, {})


def test_resume_state_and_model_weights(tmp_path):
    marker = tmp_path / "ran"
    c = _checkpoint(tmp_path / "ckpts", marker)
    with pytest.raises(UserError) as e:
        c.load_state()
    _checks(str(e.value), c.path / ckpt.STATE_FILE, marker, f"; delete {c.path} to resume from the previous checkpoint")
    with pytest.raises(UserError) as e:
        c.load_state(fix="do this")
    assert str(e.value).endswith("; do this")
    weights = tmp_path / "pytorch_model.bin"
    torch.save({"w": _Evil(marker)}, weights)
    with pytest.raises(UserError) as e:
        read_state_dict(weights)
    _checks(str(e.value), weights, marker, "use a model.safetensors file")


def test_an_untrusted_init_checkpoint_is_one_line(shards, overrides, tmp_path, capsys):
    from bertforge.model import build_model
    from bertforge.model.config import BertConfig
    from bertforge.model.hf_interop import save_pretrained

    marker = tmp_path / "ran"
    config = BertConfig.from_preset("tiny", vocab_size=64, max_position_embeddings=64)
    c = _checkpoint(
        tmp_path / "phase1" / "checkpoints",
        marker,
        lambda p: save_pretrained(build_model(config, "pretraining"), config, p, "pretraining"),
    )
    sets = overrides(shards, tmp_path / "phase2", **{"train.init_checkpoint": str(tmp_path / "phase1")})
    assert main(["pretrain", *(x for s in sets for x in ("--set", s))]) == 2
    err = "\n".join(x for x in capsys.readouterr().err.splitlines() if not x.startswith("warning: "))
    assert len(err.splitlines()) == 1, err
    _checks(err, c.path / ckpt.STATE_FILE, marker, "set train.init_checkpoint to an intact checkpoint of")
    assert "delete" not in err
