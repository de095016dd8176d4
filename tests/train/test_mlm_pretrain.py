"""`bertforge pretrain` with train.objective mlm on the built-in corpus, through the CLI (issue 22): the demo's
MLM-only data (configs/data/demo_mlm.yaml), packed and unpacked, and the objective check at start-up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bertforge.cli import main
from bertforge.runtime.metrics import read_jsonl


@pytest.fixture(scope="module")
def demo_mlm(tmp_path_factory) -> Path:
    """`data prepare --config demo_mlm` on builtin:python-docs (dupe factor 1: a few seconds)."""
    root = tmp_path_factory.mktemp("demo_mlm")
    sets = [f"output_dir={root}", "shards.dupe_factor=1", "shards.num_shards=2", "shards.workers=1"]
    assert main(["data", "prepare", "--config", "demo_mlm", *[a for s in sets for a in ("--set", s)]]) == 0
    return root


def _pretrain(root: Path, out: Path, *extra: str) -> int:
    sets = {
        "data.input_dir": root / "shards_mlm",
        "data.eval_dir": root / "eval_mlm",
        "data.vocab": root / "vocab",
        "data.num_workers": 0,
        "data.eval_batches": 2,
        "train.output_dir": out,
        "train.max_steps": 4,
        "train.global_batch_size": 16,
        "train.micro_batch_size": 8,
        "train.precision": "fp32",
        "train.device": "cpu",
        "train.log_every": 2,
        "train.save_every": 4,
        "train.eval_every": 4,
        "train.tensorboard": False,
        "train.plot": False,
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    return main(["pretrain", "--config", "demo_tiny_mlm_128", *args, *[a for e in extra for a in ("--set", e)]])


@pytest.mark.parametrize("pack", [0, 2])
def test_pretrain_mlm_objective_through_the_cli(demo_mlm, tmp_path, pack):
    out = tmp_path / "run"
    assert _pretrain(demo_mlm, out, f"data.pack_per_row={pack}") == 0
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [2, 4]
    assert all(r["loss"] > 0 and 0 <= r["mlm_acc"] <= 1 and "nsp_acc" not in r for r in rows)
    # 30% masking of full 128-token rows: round(128 x 0.3) = 38 predictions per sequence
    assert all(r["masked_per_seq"] == pytest.approx(38, abs=0.5) for r in rows)
    assert all(r["seq_per_s"] > 0 for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 4 and "final_eval_mlm_acc" in summary and "final_eval_nsp_acc" not in summary
    config = json.loads((Path(summary["model_dir"]) / "config.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM"]  # no NSP head saved
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["train"]["objective"] == "mlm" and saved["data"]["mlm_probability"] == 0.3


def test_objective_mismatch_is_a_one_line_error(demo_mlm, tmp_path, capsys):
    assert _pretrain(demo_mlm, tmp_path / "a", "train.objective=mlm_nsp") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.objective is mlm_nsp" in err and "mlm shards" in err
    assert not (tmp_path / "a" / "checkpoints").exists()
