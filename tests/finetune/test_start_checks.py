"""Bad fine-tuning input fails at start-up in one line and leaves no new directory: a tokenizer larger than the
model's vocab, a model dir without config.json or tokenizer, a crash before the first logged step, SQuAD v1.1
questions without answers, STS-B scores outside 0-5."""

from __future__ import annotations

import json
import shutil

import pytest

from bertforge.cli import main
from bertforge.errors import UserError
from bertforge.finetune import glue, runner, squad


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
        (lambda m: (m / "config.json").write_text("{bad"), "config.json: invalid JSON"),
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
