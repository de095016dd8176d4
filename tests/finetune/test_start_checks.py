"""Bad fine-tuning input fails at start-up in one line and leaves no new directory: a tokenizer larger than the
model's vocab, a model dir without config.json or tokenizer, a crash before the first logged step, SQuAD v1.1
questions without answers, STS-B scores outside 0-5, a max_seq_len over the model's positions, settings the run
would ignore, --eval-only of a model without the task's head, data files that are directories or not UTF-8, a
pre-training run as --model, a signal during set-up."""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest

from bertforge.cli import main
from bertforge.errors import UserError
from bertforge.finetune import glue, runner, squad
from bertforge.finetune.config import TaskConfig
from bertforge.model.config import BertConfig


def _fails_leaving_nothing(argv: list[str], root, capsys) -> str:
    """Run the CLI: rc 2, one line on stderr (returned), and `root` (the output dir's new parent) not created."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert not root.exists()
    return err


def test_tokenizer_larger_than_model_vocab_is_refused_at_start(encoder, finetune_argv, tmp_path, capsys):
    model = shutil.copytree(encoder, tmp_path / "model")
    n = len((model / "vocab.txt").read_text().splitlines())
    with (model / "vocab.txt").open("a") as f:  # bert-base's vocab.txt beside a smaller model, in miniature
        f.write("".join(f"extra{i}\n" for i in range(5)))
    root = tmp_path / "runs"
    err = _fails_leaving_nothing(finetune_argv(model, tmp_path, root / "out"), root, capsys)
    assert f"{model / 'vocab.txt'} has {n + 5} tokens but {model / 'config.json'} has vocab_size {n}" in err
    assert "put the model's own tokenizer files beside it" in err


@pytest.mark.parametrize(
    ("breaks", "message"),
    [
        (lambda m: (m / "config.json").write_text("{bad"), "config.json is not valid JSON"),
        (lambda m: (m / "vocab.txt").unlink(), "has neither tokenizer.json nor vocab.txt"),
    ],
    ids=["bad-config-json", "no-tokenizer"],
)
def test_bad_model_dir_leaves_no_directory(encoder, finetune_argv, tmp_path, capsys, breaks, message):
    model = shutil.copytree(encoder, tmp_path / "model")
    breaks(model)
    root = tmp_path / "runs"
    assert message in _fails_leaving_nothing(finetune_argv(model, tmp_path, root / "a" / "out"), root, capsys)


def test_crash_before_the_first_logged_step_leaves_no_directory(encoder, finetune_argv, tmp_path, monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(runner, "train_step", crash)
    root = tmp_path / "runs"
    with pytest.raises(RuntimeError, match="simulated"):
        main(finetune_argv(encoder, tmp_path, root / "out"))
    assert not root.exists()
    # a directory that was there before is left as it was
    (root / "out").mkdir(parents=True)
    (root / "out" / "notes.txt").write_text("mine")
    with pytest.raises(RuntimeError, match="simulated"):
        main(finetune_argv(encoder, tmp_path, root / "out"))
    assert (root / "out" / "notes.txt").read_text() == "mine"


# ------------------------------------------------------------------------------------------- SQuAD v1.1
CONTEXT = "paris is the capital of france ."


def _squad_file(tmp_path, *qas: dict) -> str:
    data = {"data": [{"title": "t", "paragraphs": [{"context": "x", "qas": []}, {"context": CONTEXT, "qas": qas}]}]}
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


ANSWERED = {"id": "a", "question": "what ?", "answers": [{"text": "paris", "answer_start": 0}]}


@pytest.mark.parametrize(
    "unanswered",
    [
        {"id": "b", "question": "what ?"},
        {"id": "b", "question": "what ?", "answers": []},
        {"id": "b", "question": "what ?", "answers": [], "is_impossible": True},
    ],
    ids=["no-answers-key", "empty-answers", "is-impossible"],
)
def test_squad_v1_question_without_answer_is_refused(tmp_path, capsys, unanswered):
    path = _squad_file(tmp_path, ANSWERED, unanswered)
    for training in (True, False):  # training data, and dev data (evaluate-v1.1.py cannot score it)
        with pytest.raises(UserError) as e:
            squad.read_squad(path, v1=True, training=training)
        assert str(e.value) == (
            f"SQuAD file {path}: data[0].paragraphs[1].qas[1] (id 'b') has no answers; every SQuAD v1.1 question "
            "needs at least one: add its answers, or use --task squad_v2 for a file with unanswerable questions"
        )
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps({"a": "paris", "b": ""}))
    assert main(["score", "--task", "squad", "--data", path, "--predictions", str(preds)]) == 2
    assert "(id 'b') has no answers" in capsys.readouterr().err


def test_squad_v2_keeps_unanswerable_questions(tmp_path):
    path = _squad_file(tmp_path, ANSWERED, {"id": "b", "question": "what ?", "answers": [], "is_impossible": True})
    examples, _ = squad.read_squad(path, training=True)
    assert [(e.answers, e.is_impossible) for e in examples] == [([("paris", 0)], False), ([], True)]
    # v2.0 training may leave out `answers` of an unanswerable question; an evaluation file needs the key (the
    # official script reads every question's)
    path = _squad_file(tmp_path, ANSWERED, {"id": "b", "question": "what ?", "is_impossible": True})
    assert squad.read_squad(path, training=True)[0][1].answers == []
    with pytest.raises(UserError, match=r"qas\[1\] has no 'answers'"):
        squad.read_squad(path)


def test_squad_v1_ignores_is_impossible_of_an_answered_question(tmp_path):
    path = _squad_file(tmp_path, {**ANSWERED, "is_impossible": True})
    assert not squad.read_squad(path, v1=True, training=True)[0][0].is_impossible  # run_squad.py: v2.0 only


# ------------------------------------------------------------------------------------------- STS-B
@pytest.mark.parametrize("label", ["nan", "-3", "5.5", "inf", "-inf", "high", ""])
def test_stsb_label_must_be_a_finite_score_from_0_to_5(tmp_path, label):
    spec = glue.get_task("stsb")
    header = "\t".join(f"c{i}" for i in range(10))
    rows = [header, "0\tg\tf\t2012\t0\ts\ts\ta cat .\ta dog .\t0", f"1\tg\tf\t2012\t1\ts\ts\ta .\tb .\t{label}"]
    path = tmp_path / "train.tsv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        glue.read_tsv(path, spec)
    expected = f"{path}:3: label {label!r} is not a number from 0 to 5 (STS-B scores); fix or remove the line"
    assert str(e.value) == expected
    path.write_text("\n".join([*rows[:2], rows[2].rsplit("\t", 1)[0] + "\t5.000"]) + "\n", encoding="utf-8")
    assert glue.read_tsv(path, spec).labels == [0.0, 5.0]


def test_classification_label_error_names_file_line_and_value(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text("sentence\tlabel\ngood .\t1\nbad .\t2\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        glue.read_tsv(path, glue.get_task("sst2"))
    assert str(e.value) == f"{path}:3: label '2' is not one of 0, 1 (is this a test file without labels?)"


# ------------------------------------------------------------------------------------------- settings
def test_a_sequence_longer_than_the_models_positions_is_refused(encoder, finetune_argv, tmp_path, capsys):
    root = tmp_path / "runs"
    err = _fails_leaving_nothing(
        finetune_argv(encoder, tmp_path, root / "out", "sst2", "task.max_seq_len=65"), root, capsys
    )
    assert f"task.max_seq_len 65 is longer than --model {encoder} takes (64 positions" in err
    assert "set task.max_seq_len=64 or less" in err


def test_roberta_positions_start_after_its_padding_index():
    roberta = BertConfig(model_type="roberta", pad_token_id=1, max_position_embeddings=514, vocab_size=64)
    runner.check_seq_len("m", 512, roberta)
    with pytest.raises(UserError, match="takes \\(512 positions"):
        runner.check_seq_len("m", 513, roberta)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--epochs", "0"], "train.epochs must be a finite number > 0, got 0.0"),
        (["--set", "train.seed=-1"], "train.seed must be >= 0, got -1"),
        (["--eval-only"], "--eval-only trains nothing: drop --train-file"),
        (["--dataset", "glue"], "--dataset glue is the data; --glue-dir/--train-file/--dev-file name TSV files"),
    ],
    ids=["epochs-0", "negative-seed", "eval-only-with-train-file", "dataset-with-files"],
)
def test_settings_the_run_would_ignore_or_fail_on_are_refused(encoder, finetune_argv, tmp_path, capsys, flags, message):
    root = tmp_path / "runs"
    assert message in _fails_leaving_nothing([*finetune_argv(encoder, tmp_path, root / "out"), *flags], root, capsys)


@pytest.mark.parametrize("query_len", [0, -1])
def test_squad_question_length_must_be_positive(query_len):
    with pytest.raises(UserError, match=f"task.max_query_len must be >= 1 \\(question tokens kept\\), got {query_len}"):
        TaskConfig(max_query_len=query_len).validate_squad()


# ------------------------------------------------------------------------------------------- heads
def _stsb(path, n: int) -> str:
    rows = ["\t".join(f"c{i}" for i in range(10))]
    rows += [
        f"{i}\tg\tf\t2012\t{i}\ts\ts\tgood film .\t{'bad' if i % 2 else 'nice'} plot .\t{i % 5}.0" for i in range(n)
    ]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return str(path)


def _eval_only(argv: list[str]) -> list[str]:
    train = argv.index("--train-file")
    return [*argv[:train], *argv[train + 2 :], "--eval-only"]


def test_eval_only_refuses_a_model_without_a_trained_head(encoder, finetune_argv, tmp_path, capsys):
    root = tmp_path / "runs"
    err = _fails_leaving_nothing(_eval_only(finetune_argv(encoder, tmp_path, root / "out")), root, capsys)
    assert f"--model {encoder} has no fine-tuned classification head (" in err
    assert "--eval-only would score an untrained one: pass the best/ of a run fine-tuned on this task" in err


def test_a_head_of_another_label_count_starts_afresh_in_training(encoder, finetune_argv, tmp_path, capsys):
    """A model fine-tuned on SST-2 (2 classes) fine-tunes on STS-B (1 score): its head is re-initialised, as
    transformers' ignore_mismatched_sizes; --eval-only on STS-B refuses it with advice that works."""
    assert main(finetune_argv(encoder, tmp_path, tmp_path / "sst2", "sst2", "train.epochs=1")) == 0
    tuned = tmp_path / "sst2" / "best"
    argv = finetune_argv(tuned, tmp_path, tmp_path / "stsb", "stsb", "train.epochs=1")
    argv[argv.index("--train-file") + 1] = _stsb(tmp_path / "stsb_train.tsv", 16)
    argv[argv.index("--dev-file") + 1] = _stsb(tmp_path / "stsb_dev.tsv", 8)
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"--model {tuned}: its head (classifier.weight, classifier.bias) has 2 outputs (fine-tuned for " in out
    assert "this task needs 1: it starts from a fresh init" in out
    root = tmp_path / "runs"
    err = _fails_leaving_nothing(_eval_only([*argv, "--output-dir", str(root / "e")]), root, capsys)
    assert "has 2 outputs (fine-tuned for another task), this task needs 1; --eval-only scores a model's own" in err
    assert "pass the best/ of a run fine-tuned on this task" in err


# ------------------------------------------------------------------------------------------- files
def test_a_directory_or_a_non_utf8_file_as_data_is_one_line(encoder, finetune_argv, tmp_path, capsys):
    with pytest.raises(UserError, match=f"SQuAD file {tmp_path} is a directory; give the SQuAD JSON file"):
        squad.read_squad(tmp_path)
    with pytest.raises(UserError, match="is a directory, not a TSV file"):
        glue.read_tsv(tmp_path, glue.get_task("sst2"))
    latin = tmp_path / "latin.tsv"
    latin.write_bytes("sentence\tlabel\ngood .\t1\ncaf\u00e9 .\t0\n".encode("latin-1"))
    with pytest.raises(UserError) as e:
        glue.read_tsv(latin, glue.get_task("sst2"))
    assert str(e.value).startswith(f"GLUE file {latin} is not UTF-8 text (line 3, byte 27: invalid continuation")
    root = tmp_path / "runs"
    argv = finetune_argv(encoder, tmp_path, root / "out")
    argv[argv.index("--dev-file") + 1] = str(latin)
    assert "is not UTF-8 text (line 3" in _fails_leaving_nothing(argv, root, capsys)


def test_a_pretraining_run_as_model_names_its_model_dir(encoder, finetune_argv, tmp_path, capsys):
    step = tmp_path / "pre" / "checkpoints" / "step_00000004"
    shutil.copytree(encoder, step / "model")
    (step / "meta.json").write_text("{}")
    root = tmp_path / "runs"
    err = _fails_leaving_nothing(finetune_argv(tmp_path / "pre", tmp_path, root / "out"), root, capsys)
    assert (
        f"(no config.json); this is a pre-training run: the model of its latest checkpoint is {step / 'model'}" in err
    )
    err = _fails_leaving_nothing(finetune_argv(step, tmp_path, root / "out"), root, capsys)
    assert f"(no config.json); this is a checkpoint: its model is {step / 'model'}" in err


# ------------------------------------------------------------------------------------------- signals
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_setup_stops_in_one_line_leaving_no_directory(
    encoder, finetune_argv, tmp_path, capsys, monkeypatch, sig, code
):
    def not_caught(signum, frame):  # what the process would do without handling: end the test, not pytest
        raise RuntimeError(f"{signal.Signals(signum).name} reached the process's own handler")

    real = runner.glue_task_data

    def signalled(*args):
        os.kill(os.getpid(), sig)  # e.g. while tokenizing a large training set
        return real(*args)

    monkeypatch.setattr(runner, "glue_task_data", signalled)
    old = signal.signal(signal.SIGTERM, not_caught)
    try:
        root = tmp_path / "runs"
        assert main(finetune_argv(encoder, tmp_path, root / "out")) == code
    finally:
        signal.signal(signal.SIGTERM, old)
    err = capsys.readouterr().err.strip()
    assert err == f"bertforge finetune: received {sig.name}: stopped during set-up, before training"
    assert not root.exists()
