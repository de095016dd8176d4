"""No rc 0 on a meaningless result, and one line for a malformed SQuAD/GLUE file (issue 20, classes 3 and 4)."""

from __future__ import annotations

import copy
import json

import pytest
from tokenizers import BertWordPieceTokenizer

from bertforge.cli import main
from bertforge.errors import UserError
from bertforge.finetune import glue, squad

CONTEXT = "paris is the capital of france ."
GOOD = {
    "version": "1.1",
    "data": [
        {
            "title": "t",
            "paragraphs": [
                {
                    "context": CONTEXT,
                    "qas": [
                        {
                            "id": "q1",
                            "question": "what is the capital ?",
                            "answers": [{"text": "paris", "answer_start": 0}],
                        },
                        {
                            "id": "q2",
                            "question": "what is paris ?",
                            "answers": [{"text": "capital", "answer_start": 13}],
                        },
                    ],
                }
            ],
        }
    ],
}


@pytest.fixture
def word_tokenizer(tmp_path):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "what", "is", "the", "?", ".", "paris", "capital", "of"]
    (tmp_path / "vocab.txt").write_text("\n".join(words + ["france"]) + "\n", encoding="utf-8")
    return BertWordPieceTokenizer(str(tmp_path / "vocab.txt"), lowercase=True)


def _write(tmp_path, obj, name="s.json"):
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj), encoding="utf-8")
    return path


def test_fields_the_metric_does_not_read_are_needed_for_training_only(tmp_path, capsys):
    path = _write(tmp_path, _broken(lambda o: o["data"][0]["paragraphs"][0].pop("context")), "noctx.json")
    with pytest.raises(UserError, match=r"noctx.json: data\[0\]\.paragraphs\[0\] has no 'context'"):
        squad.read_squad(path)
    preds = _write(tmp_path, {"q1": "paris", "q2": "capital"}, "preds.json")
    assert main(["score", "--task", "squad", "--data", str(path), "--predictions", str(preds), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"exact_match": 100.0, "f1": 100.0}


def test_mismatched_training_answers_are_skipped_and_counted(word_tokenizer):
    good = squad.SquadExample("good", "what is the capital ?", CONTEXT, [("paris", 0)])
    shifted = squad.SquadExample("shifted", "what is the capital ?", CONTEXT, [("capital", 3)])
    past_end = squad.SquadExample("past", "what is the capital ?", CONTEXT, [("france", 40)])
    empty = squad.SquadExample("empty", "what is the capital ?", "", [("paris", 0)])
    lines: list[str] = []
    f = squad.make_features([good, shifted, past_end, empty], word_tokenizer, 32, 8, 8, training=True, log=lines.append)
    assert f.example_index.tolist() == [0]  # only the good question is trained on
    assert (f.start_positions[0], f.end_positions[0]) == (7, 7)  # [CLS] + 5 question tokens + [SEP] -> paris
    assert len(lines) == 1 and "skipped 3 of 4 training answers whose answer_start does not match" in lines[0]
    # evaluation keeps every question (the metric reads the answer texts only)
    assert len(squad.make_features([good, shifted], word_tokenizer, 32, 8, 8, log=lines.append)) == 2
    assert len(lines) == 1
    with pytest.raises(UserError, match="none of the 2 training answers matches"):
        squad.make_features([shifted, past_end], word_tokenizer, 32, 8, 8, training=True, log=None)


def _broken(path_fn):
    obj = copy.deepcopy(GOOD)
    path_fn(obj)
    return obj


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"version": "1.1"}, "top level has no 'data'"),
        ({"data": []}, "holds no questions"),
        (_broken(lambda o: o["data"][0].pop("paragraphs")), r"data\[0\] has no 'paragraphs'"),
        (_broken(lambda o: o["data"][0]["paragraphs"][0]["qas"][1].pop("id")), r"qas\[1\] has no 'id'"),
        (
            _broken(lambda o: o["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].update(answer_start="zero")),
            r"qas\[0\]\.answers\[0\]\.answer_start is 'zero', not a character offset",
        ),
        (
            _broken(lambda o: o["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].update(answer_start=1.5)),
            "answer_start is 1.5",
        ),
        (
            _broken(lambda o: o["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].pop("text")),
            r"answers\[0\] has no 'text'",
        ),
        ("[1, 2", "not valid JSON"),
    ],
)
def test_malformed_squad_is_one_line_naming_file_and_field(tmp_path, capsys, obj, message):
    path = _write(tmp_path, obj, "bad.json")
    with pytest.raises(UserError, match=message) as e:
        squad.read_squad(path)
    assert "bad.json" in str(e.value) and "\n" not in str(e.value)
    # `bertforge score` reads the same file through the same checks: rc 2, one line, no traceback
    preds = _write(tmp_path, {"q1": "paris"}, "preds.json")
    assert main(["score", "--task", "squad", "--data", str(path), "--predictions", str(preds)]) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and len(err.strip().splitlines()) == 1


def test_score_refuses_non_numeric_na_probs(tmp_path, capsys):
    data, preds = _write(tmp_path, GOOD), _write(tmp_path, {"q1": "paris", "q2": ""}, "preds.json")
    na = _write(tmp_path, {"q1": 0.1, "q2": "high"}, "na.json")
    argv = ["score", "--task", "squad_v2", "--data", str(data), "--predictions", str(preds), "--na-probs", str(na)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "na.json" in err and "'q2'" in err and "not a number" in err
    _write(tmp_path, {"q1": 0.1, "q2": 0.9}, "na.json")
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["best_exact"] == 50.0  # q1 right, q2 (has an answer) predicted empty


def test_score_refuses_missing_na_probs_directories_and_flags_of_the_other_task(tmp_path, capsys):
    """na_probs lacking answerable ids gave "exact 100, best_exact 81.8" (the official script stops with a
    KeyError); a directory as --predictions was an IsADirectoryError traceback; --na-probs with --task squad was
    ignored."""
    data, preds = _write(tmp_path, GOOD), _write(tmp_path, {"q1": "paris", "q2": ""}, "preds.json")
    na = _write(tmp_path, {"q1": 0.1}, "na.json")
    base = ["score", "--data", str(data), "--predictions", str(preds)]
    for argv, message in (
        ([*base, "--task", "squad_v2", "--na-probs", str(na)], "has no score for 1 question(s), e.g. 'q2'"),
        ([*base, "--task", "squad", "--na-probs", str(na)], "use --task squad_v2"),
        ([*base, "--task", "squad_v2", "--na-prob-thresh", "nan"], "--na-prob-thresh must be a number"),
        (["score", "--task", "squad", "--data", str(data), "--predictions", str(tmp_path)], "is a directory"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_glue_file_with_only_a_header_is_an_error(tmp_path):
    spec = glue.get_task("mrpc")
    path = tmp_path / "train.tsv"
    path.write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"train.tsv has no examples \(only a header\)"):
        glue.read_tsv(path, spec)
    path.write_text("", encoding="utf-8")
    with pytest.raises(UserError, match=r"train.tsv has no examples \(empty\)"):
        glue.read_tsv(path, spec)


def test_squad_keys_on_a_glue_task_are_named(tmp_path, capsys):
    argv = ["finetune", "--task", "mrpc", "--model", str(tmp_path / "no-model"), "--train-file", "x.tsv"]
    main([*argv, "--set", "task.max_query_len=32", "--output-dir", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert "task.max_query_len=32 apply to SQuAD only; --task mrpc ignores them" in err
    main([*argv, "--output-dir", str(tmp_path / "o2")])
    assert "SQuAD only" not in capsys.readouterr().err


def test_question_length_is_checked_for_squad_only(tmp_path, capsys):
    base = ["finetune", "--model", str(tmp_path / "no-model"), "--dev-file", "d", "--output-dir", str(tmp_path / "o")]
    # GLUE at 64 tokens: no word about the SQuAD question length (the run fails later, on the missing model)
    assert main([*base, "--task", "mrpc", "--train-file", "t.tsv", "--set", "task.max_seq_len=64"]) == 2
    assert "max_query_len" not in capsys.readouterr().err
    assert main([*base, "--task", "squad", "--train-file", "t.json", "--set", "task.max_query_len=400"]) == 2
    assert "task.max_query_len 400 leaves no room for context in task.max_seq_len 384" in capsys.readouterr().err


def test_a_repeated_question_id_in_an_evaluation_file_is_one_line(tmp_path):
    """Two questions with one id: predictions are keyed by id, so one question was scored against the other's
    prediction (39 predictions, 40 scored) without a word."""

    def repeat(o):
        qas = o["data"][0]["paragraphs"][0]["qas"]
        qas[1]["id"] = qas[0]["id"]

    path = _write(tmp_path, _broken(repeat), "dup.json")
    with pytest.raises(UserError, match=r"dup.json: data\[0\]\.paragraphs\[0\]\.qas\[1\] repeats the id 'q1'"):
        squad.read_squad(path)
    assert len(squad.read_squad(path, training=True)[0]) == 2  # training reads each question; ids are not keys
