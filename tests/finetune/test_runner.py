"""End to end on a tiny random BERT: GLUE and SQuAD fine-tuning, the saved model loads in `transformers` with
the same outputs, eval-only, precision paths, and `bertforge score`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.config import load_config
from bertforge.errors import UserError
from bertforge.finetune import glue
from bertforge.finetune.config import FinetuneModelConfig
from bertforge.finetune.runner import FinetuneRun, collate, encode_glue, load_tokenizer, run_finetune

WORDS = [
    "the",
    "a",
    "is",
    "of",
    "and",
    "to",
    "in",
    "it",
    "was",
    "he",
    "she",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "ran",
    "fast",
    "slow",
    "big",
    "small",
    "red",
    "blue",
    "green",
    "paris",
    "london",
    "france",
    "england",
    "capital",
    "city",
    "what",
    "where",
    "who",
    "which",
    "river",
    "long",
    "name",
]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A 2-layer random BERT saved by `transformers` with a word-level vocab.txt."""
    import transformers

    d = tmp_path_factory.mktemp("tiny_bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "?"] + WORDS
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    cfg = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    transformers.BertModel(cfg).save_pretrained(d)
    return d


def _mrpc(tmp_path, n):
    rng = np.random.default_rng(0)
    rows = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
    for i in range(n):
        a = " ".join(rng.choice(WORDS, 6))
        label = i % 2
        b = a if label else " ".join(rng.choice(WORDS, 5))  # paraphrase = same words: learnable
        rows.append(f"{label}\t{i}\t{i + 1000}\t{a} .\t{b} .")
    f = tmp_path / f"mrpc{n}.tsv"
    f.write_text("\ufeff" + "\n".join(rows) + "\n", encoding="utf-8")
    return f


def _squad(tmp_path):
    ctx = "the capital of france is paris . the capital of england is london . " * 3
    qas = [
        {"id": f"q{i}", "question": q, "answers": [{"text": a, "answer_start": ctx.index(a)}]}
        for i, (q, a) in enumerate(
            [("what is the capital of france ?", "paris"), ("what is the capital of england ?", "london")] * 4
        )
    ]
    for i, qa in enumerate(qas):
        qa["id"] = f"q{i}"
    f = tmp_path / "squad.json"
    f.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": ctx, "qas": qas}]}]}))
    return f


def test_glue_train_save_and_transformers_parity(tiny_model, tmp_path):
    import transformers

    train, dev = _mrpc(tmp_path, 64), _mrpc(tmp_path, 24)
    cfg = load_config(
        "finetune",
        "mrpc_base_128",
        [
            f"train.output_dir={tmp_path / 'out'}",
            "task.max_seq_len=64",  # the tiny model's positions
            "train.global_batch_size=16",
            "train.micro_batch_size=8",
            "train.epochs=2",
            "optim.lr=1e-3",
            "train.log_every=1",
        ],
    )
    summary = run_finetune(FinetuneRun("mrpc", str(tiny_model), str(train), [str(dev)]), cfg, log=lambda s: None)
    assert [h["epoch"] for h in summary["history"]] == [1, 2]
    assert {"f1", "accuracy"} <= set(summary["best"])
    lines = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    steps = [x["step"] for x in lines if "loss" in x]
    assert [x["eval_epoch"] for x in lines if "eval_accuracy" in x] == [1, 2]
    assert steps == list(range(1, 9))  # 64 rows / 16 per update x 2 epochs
    assert lines[0]["loss"] > 0 and np.isfinite(lines[0]["grad_norm"])
    best = tmp_path / "out" / "best"
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(best).eval()
    assert hf.config.id2label == {0: "0", 1: "1"}
    # same logits as our model reloaded from the saved dir, on a padded batch
    from bertforge.model import hf_interop

    ours, _ = hf_interop.load_pretrained(best, "classification", 2)
    ours.eval()
    tok = load_tokenizer(best)
    enc = encode_glue(tok, glue.read_tsv(dev, glue.GLUE_TASKS["mrpc"]), 128, False)
    batch = collate(enc, list(range(6)), 0, torch.device("cpu"), targets=False)
    with torch.no_grad():
        np.testing.assert_allclose(ours(**batch).logits.numpy(), hf(**batch).logits.numpy(), atol=1e-5)
    # eval-only on the saved model reproduces the best epoch's metrics
    cfg2 = load_config("finetune", "mrpc_base_128", [f"train.output_dir={tmp_path / 'eval'}", "task.max_seq_len=64"])
    again = run_finetune(FinetuneRun("mrpc", str(best), None, [str(dev)], eval_only=True), cfg2, log=lambda s: None)
    assert again["best"]["accuracy"] == pytest.approx(summary["best"]["accuracy"])


def test_gradient_accumulation_matches_one_batch(tiny_model, tmp_path):
    """batch 16 as 2 x 8 micro-batches gives the same model as 1 x 16 (dropout off)."""
    train, dev = _mrpc(tmp_path, 16), _mrpc(tmp_path, 8)
    for micro in (16, 8):
        cfg = load_config(
            "finetune",
            None,
            [
                f"train.output_dir={tmp_path / str(micro)}",
                "task.max_seq_len=64",  # the tiny model's positions
                "train.global_batch_size=16",
                f"train.micro_batch_size={micro}",
                "train.epochs=1",
                "optim.lr=1e-3",
                "model.hidden_dropout=0",
                "model.attention_dropout=0",
            ],
        )
        run_finetune(FinetuneRun("mrpc", str(tiny_model), str(train), [str(dev)]), cfg, log=lambda s: None)
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "16" / "best" / "model.safetensors"))
    b = load_file(str(tmp_path / "8" / "best" / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=2e-6, rtol=1e-4)


def test_squad_train_predict_score(tiny_model, tmp_path, capsys):
    import transformers

    data = _squad(tmp_path)
    out = tmp_path / "sq"
    rc = main(
        [
            "finetune",
            "--task",
            "squad",
            "--model",
            str(tiny_model),
            "--train-file",
            str(data),
            "--dev-file",
            str(data),
            "--config",
            "squad_base_384",
            "--output-dir",
            str(out),
            "--set",
            "task.max_seq_len=24",
            "--set",
            "task.doc_stride=8",
            "--set",
            "train.global_batch_size=4",
            "--set",
            "train.micro_batch_size=4",
            "--set",
            "train.epochs=1",
            "--set",
            "task.max_query_len=10",
        ]
    )
    assert rc == 0
    preds = json.loads((out / "predictions.json").read_text())
    nbest = json.loads((out / "nbest_predictions.json").read_text())
    assert set(preds) == {f"q{i}" for i in range(8)} and all(len(v) <= 20 for v in nbest.values())
    summary = json.loads((out / "summary.json").read_text())
    assert 0 <= summary["best"]["f1"] <= 100
    transformers.AutoModelForQuestionAnswering.from_pretrained(out / "best")
    capsys.readouterr()
    assert (
        main(
            ["score", "--task", "squad", "--data", str(data), "--predictions", str(out / "predictions.json"), "--json"]
        )
        == 0
    )
    scored = json.loads(capsys.readouterr().out)
    assert scored["f1"] == pytest.approx(summary["best"]["f1"])


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_steps_are_finite(tiny_model, tmp_path, precision):
    train, dev = _mrpc(tmp_path, 16), _mrpc(tmp_path, 8)
    cfg = load_config(
        "finetune",
        None,
        [
            f"train.output_dir={tmp_path}",
            "task.max_seq_len=64",  # the tiny model's positions
            "train.global_batch_size=8",
            "train.micro_batch_size=8",
            "train.max_steps=2",
            f"train.precision={precision}",
            "train.log_every=1",
        ],
    )
    s = run_finetune(FinetuneRun("mrpc", str(tiny_model), str(train), [str(dev)]), cfg, log=lambda s: None)
    assert s["precision"] == precision
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(x["loss"]) for x in lines if "loss" in x)


def test_score_cli_v2_and_errors(tmp_path, capsys):
    data = {
        "data": [
            {
                "paragraphs": [
                    {
                        "context": "x",
                        "qas": [
                            {"id": "a", "answers": [{"text": "Paris", "answer_start": 0}]},
                            {"id": "b", "answers": []},
                        ],
                    }
                ]
            }
        ]
    }
    (tmp_path / "d.json").write_text(json.dumps(data))
    (tmp_path / "p.json").write_text(json.dumps({"a": "paris", "b": ""}))
    assert (
        main(
            [
                "score",
                "--task",
                "squad_v2",
                "--data",
                str(tmp_path / "d.json"),
                "--predictions",
                str(tmp_path / "p.json"),
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["exact"] == 100.0 and out["HasAns_total"] == 1 and out["NoAns_total"] == 1
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert (
        main(
            [
                "score",
                "--task",
                "squad_v2",
                "--data",
                str(tmp_path / "d.json"),
                "--predictions",
                str(tmp_path / "bad.json"),
            ]
        )
        == 2
    )
    assert "question id -> answer text" in capsys.readouterr().err


def test_errors(tiny_model, tmp_path):
    cfg = load_config("finetune", None, [f"train.output_dir={tmp_path}", "task.max_seq_len=64"])
    with pytest.raises(UserError, match="--train-file"):
        run_finetune(FinetuneRun("rte", str(tiny_model), None, [str(tmp_path / "dev.tsv")]), cfg)
    with pytest.raises(UserError, match="does not exist"):
        run_finetune(FinetuneRun("rte", str(tiny_model), str(tmp_path / "x.tsv"), [str(tmp_path / "y.tsv")]), cfg)
    with pytest.raises(UserError, match="config.json"):
        run_finetune(FinetuneRun("squad", str(tmp_path), None, [str(_squad(tmp_path))], eval_only=True), cfg)


def test_torchrun_two_processes_match_one(tiny_model, tmp_path):
    """2 CPU processes (gloo) x 8 rows per update give the same model as 1 process x 16 rows (dropout off). The
    epoch's last update has 1 row: the rank without one takes part at weight 0 (it hung in DDP's all-reduce)."""
    import os
    import subprocess
    import sys

    train, dev = _mrpc(tmp_path, 33), _mrpc(tmp_path, 8)
    common = [
        "--task",
        "mrpc",
        "--model",
        str(tiny_model),
        "--train-file",
        str(train),
        "--dev-file",
        str(dev),
        "--set",
        "train.global_batch_size=16",
        "--set",
        "train.micro_batch_size=8",
        "--set",
        "train.epochs=1",
        "--set",
        "optim.lr=1e-3",
        "--set",
        "model.hidden_dropout=0",
        "--set",
        "model.attention_dropout=0",
        "--set",
        "train.precision=fp32",
        "--set",
        "task.max_seq_len=64",
    ]  # auto picks bf16 on a native-bf16 CPU
    assert main(["finetune", *common, "--output-dir", str(tmp_path / "one"), "--set", "train.micro_batch_size=16"]) == 0
    import socket

    with socket.socket() as s:  # a free port: a fixed one collides with any other run on the machine
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(port),
            "-m",
            "bertforge",
            "finetune",
            *common,
            "--output-dir",
            str(tmp_path / "two"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "one" / "best" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "best" / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=2e-6, rtol=1e-4)
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["world_size"] == 2


@pytest.mark.parametrize("grouped", [False, True])
def test_train_batches_cover_every_row_once(grouped):
    from bertforge.finetune.runner import train_batches

    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 128, 1000)
    batches = train_batches(lengths, 32, np.random.default_rng(1), grouped)
    rows = np.concatenate(batches)
    assert sorted(rows.tolist()) == list(range(1000))
    assert sorted(len(b) for b in batches) == [8] + [32] * 31
    padded = sum(lengths[b].max() * len(b) for b in batches)
    if grouped:  # far less padding than random batches
        random_padded = sum(lengths[b].max() * len(b) for b in train_batches(lengths, 32, np.random.default_rng(1)))
        assert padded < 0.8 * random_padded


@pytest.fixture(scope="module")
def tiny_roberta(tmp_path_factory):
    """A 2-layer random RoBERTa with a byte-level BPE tokenizer.json trained on the test words."""
    import transformers
    from tokenizers import ByteLevelBPETokenizer
    from tokenizers.processors import RobertaProcessing

    d = tmp_path_factory.mktemp("tiny_roberta")
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(
        [" ".join(WORDS)] * 20,
        vocab_size=300,
        min_frequency=1,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
    )
    tok.post_processor = RobertaProcessing(
        ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")), trim_offsets=True
    )
    tok.save(str(d / "tokenizer.json"))
    cfg = transformers.RobertaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=80,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    transformers.RobertaModel(cfg).save_pretrained(d)
    return d


def test_roberta_squad_and_glue(tiny_roberta, tmp_path):
    import transformers

    from bertforge.finetune import squad

    data = _squad(tmp_path)
    tok = load_tokenizer(tiny_roberta)
    examples, _ = squad.read_squad(data)
    f = squad.make_features(examples, tok, max_seq_len=32, doc_stride=8, max_query_len=12, training=True)
    # <s> q </s></s> ctx </s>, no token types; answers recovered exactly through the (trimmed) offsets
    assert f.input_ids[0][0] == tok.token_to_id("<s>") and f.input_ids[0][-1] == tok.token_to_id("</s>")
    assert all(t.sum() == 0 for t in f.token_type_ids)
    for i in range(len(f)):
        s, e = int(f.start_positions[i]), int(f.end_positions[i])
        if s:
            ex = examples[f.example_index[i]]
            c0, off = int(f.ctx_offset[i]), f.offsets[i]
            assert ex.context[off[s - c0, 0] : off[e - c0, 1]] == ex.answers[0][0]
    cfg = load_config(
        "finetune",
        "squad_base_384",
        [
            f"train.output_dir={tmp_path / 'sq'}",
            "task.max_seq_len=32",
            "task.doc_stride=8",
            "task.max_query_len=12",
            "train.global_batch_size=4",
            "train.micro_batch_size=4",
            "train.epochs=1",
        ],
    )
    s = run_finetune(FinetuneRun("squad", str(tiny_roberta), str(data), [str(data)]), cfg, log=lambda m: None)
    assert 0 <= s["best"]["f1"] <= 100
    preds = json.loads((tmp_path / "sq" / "predictions.json").read_text())
    assert all(p == p.strip() for p in preds.values())
    transformers.AutoModelForQuestionAnswering.from_pretrained(tmp_path / "sq" / "best")
    train, dev = _mrpc(tmp_path, 16), _mrpc(tmp_path, 8)
    cfg = load_config(
        "finetune",
        None,
        [
            f"train.output_dir={tmp_path / 'gl'}",
            "task.max_seq_len=64",  # the tiny model's positions
            "train.global_batch_size=8",
            "train.micro_batch_size=8",
            "train.epochs=1",
        ],
    )
    run_finetune(FinetuneRun("mrpc", str(tiny_roberta), str(train), [str(dev)]), cfg, log=lambda m: None)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "gl" / "best")
    assert hf.config.model_type == "roberta"


def test_pad_to_max_length_gives_the_reference_squad_loss(tiny_model, tmp_path, monkeypatch):
    """The QA loss is a softmax over every position of the padded row, padding included (Google's run_squad.py,
    HF's BertForQuestionAnswering): a row's loss depends on how far its batch is padded. With `pad_to` =
    max_seq_len it no longer does, and equals `transformers`' on inputs padded to max_length (run_qa.py)."""
    import transformers

    from bertforge.finetune import runner

    rng = np.random.default_rng(0)
    lens = [9, 14, 20]
    data = runner.Encoded(
        [rng.integers(5, 40, n) for n in lens],
        [np.r_[np.zeros(4), np.ones(n - 4)].astype(np.int64) for n in lens],
        {"start_positions": np.array([5, 6, 7]), "end_positions": np.array([6, 8, 9])},
    )
    torch.manual_seed(0)
    ours, _ = runner.load_model(str(tiny_model), "qa", 2, config_overrides=FinetuneModelConfig(0.0, 0.0).overrides())
    ref = transformers.AutoModelForQuestionAnswering.from_pretrained(tiny_model)
    ref.load_state_dict(
        {**ref.state_dict(), "qa_outputs.weight": ours.qa_outputs.weight, "qa_outputs.bias": ours.qa_outputs.bias}
    )
    ours.eval(), ref.eval()
    cpu = torch.device("cpu")

    def loss(rows, pad_to=0):
        with torch.no_grad():
            return float(ours(**collate(data, rows, 0, cpu, pad_to=pad_to)).loss)

    assert loss([0]) != pytest.approx(loss([0, 2]), abs=1e-4)  # padded to 9 alone, to 20 beside row 2
    assert loss([0], 32) == pytest.approx(loss([0, 2], 32) * 2 - loss([2], 32), abs=1e-5)
    b = collate(data, [0, 1, 2], 0, cpu, pad_to=32)
    assert b["input_ids"].shape == (3, 32)
    with torch.no_grad():
        expect = ref(**{**b, "attention_mask": (b["attention_mask"] != 0).long()}).loss
    assert loss([0, 1, 2], 32) == pytest.approx(float(expect), abs=1e-5)

    # the run pads every training batch to max_seq_len with the option, and only then (evaluation never does)
    seen = []

    def spy(*a, **k):
        if k.get("targets", True):  # a training batch
            seen.append(k.get("pad_to", 0))
        return collate(*a, **k)

    monkeypatch.setattr(runner, "collate", spy)
    sq = _squad(tmp_path)
    for pad in (True, False):
        seen.clear()
        cfg = load_config(
            "finetune",
            "squad_base_384",
            [
                f"train.output_dir={tmp_path / str(pad)}",
                "task.max_seq_len=24",
                "task.doc_stride=8",
                "task.max_query_len=10",
                "train.global_batch_size=4",
                "train.micro_batch_size=4",
                "train.epochs=1",
                f"train.pad_to_max_length={str(pad).lower()}",
            ],
        )
        run_finetune(FinetuneRun("squad", str(tiny_model), str(sq), [str(sq)]), cfg, log=lambda s: None)
        assert seen and set(seen) == ({24} if pad else {0})


def _cfg(tmp_path, *extra):
    return load_config(
        "finetune",
        None,
        [
            f"train.output_dir={tmp_path}",
            "task.max_seq_len=64",  # the tiny model's positions
            "train.global_batch_size=8",
            "train.micro_batch_size=4",
            "train.epochs=1",
            "train.precision=fp32",
            "train.log_every=1",
            *extra,
        ],
    )


def test_runner_calls_the_one_training_step(tiny_model, tmp_path, monkeypatch):
    """Fine-tuning's update is `runtime.step.train_step` (the pre-training loop's): the same function object, really
    called once per update, with this rank's micro-batches weighted by their share of the global batch."""
    from bertforge.finetune import runner
    from bertforge.runtime import step as product

    assert runner.train_step is product.train_step
    calls = []

    def spy(step, batches, accum, **k):
        calls.append((accum, k["weights"]))
        return product.train_step(step, batches, accum, **k)

    monkeypatch.setattr(runner, "train_step", spy)
    train, dev = _mrpc(tmp_path, 20), _mrpc(tmp_path, 8)
    run_finetune(FinetuneRun("mrpc", str(tiny_model), str(train), [str(dev)]), _cfg(tmp_path), log=lambda s: None)
    # 20 rows in global batches of 8: 8, 8, 4 -> micro-batches of 4
    assert calls == [(2, [0.5, 0.5]), (2, [0.5, 0.5]), (1, [1.0])]


def test_lamb_and_poly_schedule_for_finetuning(tiny_model, tmp_path, monkeypatch):
    """optim.name and optim.schedule are honoured (the runner used to hard-code AdamW and linear)."""
    from bertforge.finetune import runner
    from bertforge.optim.lamb import Lamb
    from bertforge.optim.schedule import lr_at

    built = []
    real = runner.optimizer_for
    monkeypatch.setattr(runner, "optimizer_for", lambda *a, **k: built.append(real(*a, **k)) or built[-1])
    train, dev = _mrpc(tmp_path, 32), _mrpc(tmp_path, 8)
    cfg = _cfg(tmp_path, "optim.name=lamb", "optim.schedule=poly", "optim.lr=1e-2", "optim.warmup=0.25")
    s = run_finetune(FinetuneRun("mrpc", str(tiny_model), str(train), [str(dev)]), cfg, log=lambda s: None)
    assert isinstance(built[0], Lamb) and s["skipped_steps"] == 0
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lrs = [x["lr"] for x in lines if "loss" in x]
    assert lrs == pytest.approx([lr_at(i, 1e-2, 4, 0.25, "poly") for i in range(1, 5)])
    assert all(np.isfinite(x["loss"]) for x in lines if "loss" in x)
    from safetensors.torch import load_file

    before = load_file(str(tiny_model / "model.safetensors"))
    after = load_file(str(tmp_path / "best" / "model.safetensors"))
    key = next(k for k in after if k.endswith("word_embeddings.weight"))
    assert not torch.equal(before[next(k for k in before if k.endswith("word_embeddings.weight"))], after[key])


def test_nonfinite_updates_are_skipped_counted_and_stop_the_run(tiny_model, tmp_path, monkeypatch):
    from bertforge.finetune import runner
    from bertforge.runtime import step as product

    poisoned = {1, 2}  # NaN loss weights -> NaN gradients on these updates

    def nan_on_some(step, batches, accum, weights):
        nonlocal n
        n += 1
        return product.train_step(step, batches, accum, weights=[float("nan")] * accum if n in poisoned else weights)

    monkeypatch.setattr(runner, "train_step", nan_on_some)
    train, dev = _mrpc(tmp_path, 32), _mrpc(tmp_path, 8)
    n = 0
    s = run_finetune(
        FinetuneRun("mrpc", str(tiny_model), str(train), [str(dev)]), _cfg(tmp_path / "a"), log=lambda s: None
    )
    assert s["skipped_steps"] == 2 and np.isfinite(s["best"]["accuracy"])
    n, poisoned = 0, {2, 3, 4}
    with pytest.raises(UserError, match=r"3 non-finite gradient steps in a row at update 4.*no model was saved"):
        run_finetune(
            FinetuneRun("mrpc", str(tiny_model), str(train), [str(dev)]),
            _cfg(tmp_path / "b", "train.max_nonfinite_steps=3"),
            log=lambda s: None,
        )


def test_eval_every_evaluates_within_epochs(tiny_model, tmp_path):
    train, dev = _mrpc(tmp_path, 32), _mrpc(tmp_path, 8)
    s = run_finetune(
        FinetuneRun("mrpc", str(tiny_model), str(train), [str(dev)]),
        _cfg(tmp_path, "train.eval_every=3", "train.epochs=2"),
        log=lambda s: None,
    )
    # 4 updates per epoch: step 3 (0.75), the epoch ends (1, 2) and step 6 (1.5)
    assert [(h["step"], h["epoch"]) for h in s["history"]] == [(3, 0.75), (4, 1), (6, 1.5), (8, 2)]
    assert s["best"] in s["history"] and (tmp_path / "best" / "model.safetensors").is_file()


def test_optim_compile_fine_tunes_with_the_compiled_lamb_and_checks_its_toolchain(tiny_model, tmp_path, monkeypatch):
    """optim.compile reaches fine-tuning's LAMB; without a C++ compiler the run is refused before it starts."""
    from torch._inductor import cpp_builder
    from torch._inductor.exc import InvalidCxxCompiler

    from bertforge.finetune import runner

    built = []
    real = runner.optimizer_for
    monkeypatch.setattr(runner, "optimizer_for", lambda *a, **k: built.append(real(*a, **k)) or built[-1])
    train, dev = _mrpc(tmp_path, 16), _mrpc(tmp_path, 8)
    cfg = _cfg(tmp_path / "a", "optim.name=lamb", "optim.compile=true", "optim.lr=1e-2")
    s = run_finetune(FinetuneRun("mrpc", str(tiny_model), str(train), [str(dev)]), cfg, log=lambda s: None)
    from bertforge.optim.lamb import lamb_update

    assert s["skipped_steps"] == 0 and built[0]._update is not lamb_update  # torch.compile's wrapper of it

    def no_compiler():
        raise InvalidCxxCompiler

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", no_compiler)
    with pytest.raises(UserError, match="optim.compile: torch.compile on the CPU"):
        run_finetune(
            FinetuneRun("mrpc", str(tiny_model), str(train), [str(dev)]),
            _cfg(tmp_path / "b", "optim.name=lamb", "optim.compile=true"),
        )
    assert not (tmp_path / "b").exists()


def test_fine_tuning_compiles_layer_by_layer_and_saves_the_models_own_keys(tiny_model, tmp_path):
    """train.compile_scope=layers reaches fine-tuning: the run says it compiles, trains, and its best model
    has the keys of the checkpoint it started from (the layers were compiled in place)."""
    from safetensors.torch import load_file

    train, dev = _mrpc(tmp_path, 16), _mrpc(tmp_path, 8)
    lines: list[str] = []
    cfg = _cfg(tmp_path / "a", "train.compile=true", "train.compile_scope=layers")
    s = run_finetune(FinetuneRun("mrpc", str(tiny_model), str(train), [str(dev)]), cfg, log=lines.append)
    assert "compiling the step (layers scope): the first step waits for it" in lines
    assert s["skipped_steps"] == 0
    best = load_file(str(tmp_path / "a" / "best" / "model.safetensors"))
    encoder = {k for k in load_file(str(tiny_model / "model.safetensors")) if ".layer." in k}
    assert len(encoder) == 32 and encoder <= {k.removeprefix("bert.") for k in best}  # saved as bert.encoder...
