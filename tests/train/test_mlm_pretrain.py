"""`bertforge pretrain` with train.objective mlm on the built-in corpus, through the CLI (issue 22): the demo's
MLM-only data (configs/data/demo_mlm.yaml), packed and unpacked, and the objective check at start-up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from bertforge.cli import main
from bertforge.runtime.metrics import read_jsonl


def _pretrain(root: Path, out: Path, *extra: str, config: str = "demo_tiny_mlm_128") -> int:
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
    return main(["pretrain", "--config", config, *args, *[a for e in extra for a in ("--set", e)]])


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


def test_eval_mlm_probability_sets_the_held_out_rate_only(demo_mlm, tmp_path, monkeypatch):
    """data.eval_mlm_probability: training masks 30%, held-out evaluation masks 15% (one task for comparing runs
    trained at different rates); unset, evaluation follows the training rate."""
    import bertforge.train.loop as loop

    seen: list[float | None] = []
    real = loop.eval_batches

    def recording(*args, **kwargs):
        seen.append(kwargs.get("mlm_probability"))
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "eval_batches", recording)
    assert _pretrain(demo_mlm, tmp_path / "a", "data.eval_mlm_probability=0.15") == 0
    assert _pretrain(demo_mlm, tmp_path / "b") == 0
    assert seen == [0.15, 0.3]
    rows = [r for r in read_jsonl(tmp_path / "a" / "metrics.jsonl") if "loss" in r]
    assert all(r["masked_per_seq"] == pytest.approx(38, abs=0.5) for r in rows)  # training still at 30%


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        ({"eval_mlm_probability": 1.5}, "data.eval_mlm_probability must be in (0, 1)"),
        ({"input_dir": "synthetic", "eval_mlm_probability": 0.15}, "data.input_dir: synthetic draws its own masks"),
    ],
)
def test_eval_mlm_probability_is_validated(sets, message):
    from bertforge.errors import ConfigError
    from bertforge.train.config import PretrainDataConfig

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PretrainDataConfig(**sets).validate()


def _mrpc(path: Path, n: int) -> Path:
    """MRPC's TSV layout; a paraphrase repeats the first sentence's words (learnable), a non-paraphrase does not."""
    words = [
        "the",
        "function",
        "returns",
        "a",
        "new",
        "list",
        "of",
        "values",
        "from",
        "the",
        "module",
        "and",
        "the",
        "class",
    ]
    rows = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
    for i in range(n):
        a = " ".join(words[(i + j) % len(words)] for j in range(6))
        b = a if i % 2 else " ".join(words[(3 * i + j) % len(words)] for j in range(5, 0, -1))
        rows.append(f"{i % 2}\t{i}\t{i + 1000}\t{a} .\t{b} .")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_mrpc_fine_tunes_from_a_modernbert_we_pretrained(demo_mlm, tmp_path):
    """Issue 22: ModernBERT-tiny pre-trained by `bertforge pretrain` (MLM only, 30% masking, the preset's recipe)
    then `bertforge finetune --task mrpc` on its checkpoint, scored with MRPC's official F1 and accuracy; the
    best model is a ModernBertForSequenceClassification that transformers loads with the same logits."""
    import torch
    import transformers

    from bertforge.finetune import glue
    from bertforge.finetune.runner import collate, encode_glue, load_tokenizer
    from bertforge.model import hf_interop

    assert (
        _pretrain(demo_mlm, tmp_path / "pre", "model.max_position_embeddings=1024", config="modernbert_tiny_1024") == 0
    )
    model_dir = json.loads((tmp_path / "pre" / "summary.json").read_text())["model_dir"]
    train, dev = _mrpc(tmp_path / "train.tsv", 32), _mrpc(tmp_path / "dev.tsv", 16)
    sets = ["train.global_batch_size=8", "train.micro_batch_size=8", "train.precision=fp32", "train.device=cpu"]
    sets += ["train.epochs=1", "train.plot=false", "train.tensorboard=false"]
    argv = ["finetune", "--task", "mrpc", "--model", model_dir, "--train-file", str(train), "--dev-file", str(dev)]
    assert main([*argv, "--output-dir", str(tmp_path / "ft"), *(x for s in sets for x in ("--set", s))]) == 0
    best = json.loads((tmp_path / "ft" / "summary.json").read_text())["best"]
    assert 0 <= best["f1"] <= 100 and 0 <= best["accuracy"] <= 100
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "ft" / "best").eval()
    assert type(hf).__name__ == "ModernBertForSequenceClassification"
    ours, _ = hf_interop.load_pretrained(tmp_path / "ft" / "best", "classification", 2)
    tok = load_tokenizer(tmp_path / "ft" / "best")
    enc = encode_glue(tok, glue.read_tsv(dev, glue.GLUE_TASKS["mrpc"]), 128, False)
    batch = collate(enc, list(range(6)), 0, torch.device("cpu"), targets=False)  # padded: rows differ in length
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(**batch).logits, hf(**batch).logits, atol=1e-5, rtol=1e-4)


def test_random_words_come_from_the_datas_vocab_when_model_vocab_size_is_larger(demo_mlm, tmp_path, monkeypatch):
    """model.vocab_size set above the vocab (NVIDIA's 30528, ModernBERT's 50368) adds rows that are no token:
    dynamic masking's random replacement words, in training and in evaluation, must be drawn from the data's
    vocab, as Google's masking draws them, never from those rows (the loader drew up to the model's size)."""
    import itertools

    from bertforge.data.vocab import load_tokenizer, vocab_rows
    from bertforge.train import loop

    rows = vocab_rows(load_tokenizer(demo_mlm / "vocab"))
    runs, real_setup = [], loop.setup
    monkeypatch.setattr(loop, "setup", lambda *a, **k: runs.append(real_setup(*a, **k)) or runs[-1])
    seen: list[torch.Tensor] = []
    real_eval = loop.eval_batches
    monkeypatch.setattr(
        loop, "eval_batches", lambda *a, **k: (seen.append(x["input_ids"]) or x for x in real_eval(*a, **k))
    )
    random_only = ("data.mask_replace_prob=0.0", "data.random_replace_prob=1.0")  # in evaluation too
    extra = (*random_only, f"model.vocab_size={rows + 4096}", "train.max_steps=1")
    assert _pretrain(demo_mlm, tmp_path / "run", *extra, "train.eval_every=1", "train.save_every=0") == 0
    run = runs[0]
    assert run.bert_cfg.vocab_size >= rows + 4096 and run.vocab_size == rows  # padded to a multiple of 8
    ids = torch.cat([b["input_ids"].flatten() for b in itertools.islice(run.loader.iterate(), 4)])
    assert seen and ids.max() < rows and max(int(b.max()) for b in seen) < rows  # ~1,200 draws, were up to rows + 4096


def test_a_model_vocab_size_below_the_datas_vocab_is_refused(demo_mlm, tmp_path):
    from bertforge.config import load_config
    from bertforge.data.shardset import ShardSet
    from bertforge.errors import UserError
    from bertforge.train.loop import resolve_vocab

    sets = {"data.input_dir": demo_mlm / "shards_mlm", "data.vocab": demo_mlm / "vocab", "model.vocab_size": 50}
    cfg = load_config("pretrain", "demo_tiny_mlm_128", [f"{k}={v}" for k, v in sets.items()])
    with pytest.raises(UserError, match="model.vocab_size 50 is smaller than the vocab of the data"):
        resolve_vocab(cfg, ShardSet.open(cfg.data.input_dir))


def test_auto_switches_see_the_runs_resolved_precision(demo_mlm, tmp_path, monkeypatch):
    """train.low_precision_layernorm's auto depends on the precision the run resolved (bf16 only): setup hands
    resolve_auto that, not the config's "auto"; config.yaml records the decision (off here: not a fast device)."""
    import yaml

    from bertforge.train import loop

    seen = []
    real = loop.resolve_auto
    monkeypatch.setattr(loop, "resolve_auto", lambda t, o, fast, fixed, precision: seen.append(precision) or real(
        t, o, fast, fixed, precision
    ))  # fmt: skip
    args = ("train.precision=bf16", "train.max_steps=1", "train.save_every=0")
    assert _pretrain(demo_mlm, tmp_path / "run", *args) == 0
    assert seen == ["bf16"]
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["train"]["low_precision_layernorm"] is False


def test_rows_packed_on_the_fly_do_not_count_as_fixed_shapes(demo_mlm, tmp_path, monkeypatch):
    """data.pack_per_row packs each micro-batch's sequences into as many rows as they need, a number that varies
    from batch to batch: `auto` must not capture CUDA graphs for it as for packed shards' fixed rows (each new
    shape would be compiled and recorded again)."""
    from bertforge.train import loop

    seen = []
    real = loop.resolve_auto
    monkeypatch.setattr(loop, "resolve_auto", lambda *a: seen.append(a[3]) or real(*a))
    assert _pretrain(demo_mlm, tmp_path / "run", "data.pack_per_row=2", "train.max_steps=1", "train.save_every=0") == 0
    assert seen == [False]
