"""The command line walked as a new user walks it: an empty value (`--out "$OUT"` with OUT unset) is one line naming
the flag, exit status 2, and nothing is written or read in the working directory."""

from __future__ import annotations

import pytest
from tests.helpers import one_line

from bertforge import cli


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["pack", "--in", "", "--out", "packed"], "--in"),
        (["pack", "--in", "shards", "--out", ""], "--out"),
        (["pretrain", "--config", ""], "--config"),
        (["pretrain", "--json-summary", "", "--set", "train.max_steps=1"], "--json-summary"),
        (["bench", "--show", ""], "--show"),
        (["bench", "--spec", ""], "--spec"),
        (["bench", "--spec", "data_shards", "--json", ""], "--json"),
        (["bench", "--spec", "data_shards", "--md", ""], "--md"),
        (["bench", "--spec", "data_shards", "--only", ""], "--only"),
        (["score", "--task", "squad", "--data", "", "--predictions", "preds.json"], "--data"),
        (["score", "--task", "squad", "--data", "dev.json", "--predictions", ""], "--predictions"),
    ],
)
def test_an_empty_value_is_refused_in_one_line(argv, flag, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # an empty path is the working directory: nothing may land here
    assert cli.main(argv) == 2
    one_line(capsys.readouterr().err, f"bertforge {argv[0]}: error: {flag} is empty")
    assert list(tmp_path.iterdir()) == []


def _squad_v2(tmp_path):
    import json

    qas = [
        {"id": "q1", "question": "Who?", "answers": [{"text": "Ada", "answer_start": 0}], "is_impossible": False},
        {"id": "q2", "question": "When?", "answers": [], "is_impossible": True},
    ]
    data = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": "Ada wrote it.", "qas": qas}]}]}
    (tmp_path / "dev.json").write_text(json.dumps(data), encoding="utf-8")
    (tmp_path / "preds.json").write_text(json.dumps({"q1": "Ada", "q2": ""}), encoding="utf-8")
    return str(tmp_path / "dev.json"), str(tmp_path / "preds.json")


def test_score_refuses_an_empty_na_probs(tmp_path, capsys):
    data, preds = _squad_v2(tmp_path)
    assert cli.main(["score", "--task", "squad_v2", "--data", data, "--predictions", preds]) == 0  # the file is fine
    capsys.readouterr()
    # read as not given, the scores came without the best-threshold search the user asked for
    argv = ["score", "--task", "squad_v2", "--data", data, "--predictions", preds, "--na-probs", ""]
    assert cli.main(argv) == 2
    one_line(capsys.readouterr().err, "bertforge score: error: --na-probs is empty")


@pytest.mark.parametrize("extra", [["--json", "again.json"], ["--repeat", "5"], ["--only", "x"], ["--resume"]])
def test_bench_show_refuses_the_flags_of_a_run(extra, tmp_path, capsys):
    # --show prints a saved report and runs nothing: --json wrote no file, --repeat/--only/--resume did nothing
    import json

    machine = {"cpu": "c", "threads": 1, "torch": "t", "bertforge": "b", "devices": ["cpu"]}
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"title": "t", "date": "d", "machine": machine, "results": [], "ratios": []}))
    assert cli.main(["bench", "--show", str(report)]) == 0  # the report is fine
    capsys.readouterr()
    assert cli.main(["bench", "--show", str(report), *extra]) == 2
    one_line(capsys.readouterr().err, "bertforge bench: error: ", f"{extra[0]} shape a run, and --show")


@pytest.mark.parametrize(
    "sets, parts",
    [
        (["vocab.model=bpe", "vocab.vocab_size=200"], ["vocab.vocab_size 200", "bpe", "above 261"]),
        (["vocab.vocab_size=64", "vocab.unused_tokens=40"], ["vocab.vocab_size 64", "unused_tokens 40", "above 71"]),
    ],
)
def test_prepare_refuses_a_vocab_too_small_before_the_documents(sets, parts, tiny_corpus, tmp_path, capsys):
    # the vocab step refused it only after the documents step, which takes hours on a Wikipedia dump
    out = tmp_path / "prepared"
    argv = ["data", "prepare", "--set", f"docs.source={tiny_corpus}", "--set", f"output_dir={out}"]
    assert cli.main([*argv, *(x for s in sets for x in ("--set", s))]) == 2
    one_line(capsys.readouterr().err, "bertforge data: error: ", *parts)
    assert not out.exists()  # no documents written


def test_squad_without_a_dev_file_is_not_pointed_to_dataset():
    """--dataset is refused for SQuAD: the message for a missing --dev-file must not suggest it there."""
    from bertforge.errors import UserError
    from bertforge.finetune.runner import FinetuneRun, _check_run

    with pytest.raises(UserError, match=r"give --dev-file \(evaluation data\) \(a SQuAD JSON file\)$"):
        _check_run(FinetuneRun("squad", "model"))
    with pytest.raises(UserError, match="or --dataset$"):
        _check_run(FinetuneRun("mrpc", "model"))
