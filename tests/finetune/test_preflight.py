"""Single-task fine-tuning (SQuAD, one GLUE task) checked before any work: settings and paths refused at start-up
in one line (a non-finite SQuAD v2.0 threshold, an empty --output-dir/--config/--glue-dir, one dev file given
twice, an output path of the wrong kind), dev files of the same name keep their own metrics, best/ is one
directory renamed into place (a kill while it is written leaves no model without its tokenizer nor a truncated
predictions.json), and best/ holds only the predictions this run wrote."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tests.helpers import one_line

from bertforge.cli import main
from bertforge.data.vocab import load_tokenizer
from bertforge.finetune import runner
from bertforge.finetune.config import TaskConfig

CONTEXT = "good film . bad plot . fine actor . great scene ."


def _squad(path: Path, n: int) -> Path:
    """A SQuAD v1.1 file of `n` questions on one paragraph of the conftest encoder's words."""
    qas = [
        {
            "id": f"q{i}",
            "question": "good film ?",
            "answers": [{"text": "bad plot", "answer_start": CONTEXT.index("bad plot")}],
        }
        for i in range(n)
    ]
    data = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": CONTEXT, "qas": qas}]}]}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _squad_argv(encoder: Path, tmp_path: Path, out: Path, devs: list[Path], task: str = "squad") -> list[str]:
    train = _squad(tmp_path / "train.json", 8)
    sets = ["train.global_batch_size=8", "train.micro_batch_size=8", "train.precision=fp32", "train.device=cpu"]
    sets += ["train.plot=false", "train.epochs=1", "task.max_seq_len=64", "task.max_query_len=16"]
    argv = ["finetune", "--task", task, "--model", str(encoder), "--train-file", str(train)]
    argv += [x for d in devs for x in ("--dev-file", str(d))]
    return [*argv, "--output-dir", str(out), *(x for s in sets for x in ("--set", s))]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_non_finite_null_score_threshold_is_refused_at_start(encoder, tmp_path, capsys, value):
    # NaN made every no-answer comparison false: v2.0 never predicted no-answer and reported its scores, exit 0
    out = tmp_path / "out"
    argv = _squad_argv(encoder, tmp_path, out, [_squad(tmp_path / "dev.json", 2)], "squad_v2")
    assert main([*argv, "--set", f"task.null_score_diff_threshold={value}"]) == 2
    one_line(capsys.readouterr().err, "task.null_score_diff_threshold must be a finite number")
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--output-dir", "--config", "--glue-dir"])
@pytest.mark.parametrize("task", ["sst2", "glue"])
def test_an_empty_path_flag_is_refused_not_taken_as_its_default(
    encoder, finetune_argv, tmp_path, capsys, monkeypatch, flag, task
):
    # `--output-dir "$OUT"` with OUT unset wrote to runs/finetune (or runs/glue) below the working directory
    monkeypatch.chdir(tmp_path)
    argv = finetune_argv(encoder, tmp_path, tmp_path / "out", "sst2")
    if task == "glue":
        argv = ["finetune", "--task", "glue", "--model", str(encoder), "--glue-dir", str(tmp_path)]
    if flag in argv:
        del argv[argv.index(flag) : argv.index(flag) + 2]
    assert main([*argv, flag, ""]) == 2
    one_line(capsys.readouterr().err, f"{flag} is empty")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()


def test_one_dev_file_given_twice_is_refused(encoder, finetune_argv, tmp_path, capsys):
    argv = finetune_argv(encoder, tmp_path, tmp_path / "out", "sst2")
    dev = argv[argv.index("--dev-file") + 1]
    again = str(Path(dev).parent / ".." / tmp_path.name / "dev.tsv")  # the same file by another name
    assert main([*argv, "--dev-file", again]) == 2
    one_line(capsys.readouterr().err, f"--dev-file {again} names the file of --dev-file {dev} again")
    assert not (tmp_path / "out").exists()


def test_dev_files_of_the_same_name_keep_their_own_metrics(encoder, finetune_argv, tmp_path):
    # both were reported under "dev/...": the second set's numbers replaced the first's (its `main` too)
    finetune_argv(encoder, tmp_path, tmp_path / "out", "sst2")  # writes train.tsv and dev.tsv (8 rows)
    other = tmp_path / "other" / "dev.tsv"
    other.parent.mkdir()
    other.write_text("sentence\tlabel\ngood film .\t1\n", encoding="utf-8")
    run = runner.FinetuneRun("sst2", str(encoder), str(tmp_path / "train.tsv"), [str(tmp_path / "dev.tsv"), str(other)])
    task = runner.glue_task_data(run, TaskConfig(max_seq_len=64), load_tokenizer(encoder))
    assert [name for name, _, _ in task.evals] == ["dev", "dev_1"]
    assert [len(rows) for _, rows, _ in task.evals] == [8, 1]
    assert runner.eval_names(["a/dev.tsv", "b/dev.tsv", "c/dev_1.tsv"]) == ["dev", "dev_1", "dev_1_2"]


@pytest.mark.parametrize("stops_at", ["vocab.txt", "predictions.json"])
def test_a_stop_while_best_is_written_leaves_no_incomplete_best(encoder, tmp_path, capsys, monkeypatch, stops_at):
    # best/ was renamed into place with config.json and the weights, then the tokenizer files and the predictions
    # were copied into it in place: a second Ctrl-C (or a kill) there left a model without its vocab.txt, or a
    # truncated predictions.json, in a directory that looks complete
    out = tmp_path / "out"
    argv = _squad_argv(encoder, tmp_path, out, [_squad(tmp_path / "dev.json", 2)])
    copy = shutil.copyfile

    def cut_off(src, dst, *a, **k):
        if Path(dst).name == stops_at:
            Path(dst).write_bytes(Path(src).read_bytes()[:5])
            raise KeyboardInterrupt
        return copy(src, dst, *a, **k)

    monkeypatch.setattr(shutil, "copyfile", cut_off)
    assert main(argv) == 130
    capsys.readouterr()
    best = out / "best"
    if best.exists():  # the earlier best/ (none here) or this evaluation's, whole
        assert (best / "vocab.txt").is_file() and (best / "predictions.json").is_file(), sorted(best.iterdir())
        assert json.loads((best / "predictions.json").read_text(encoding="utf-8"))
    assert not [p.name for p in out.iterdir() if p.name.startswith(".best")]  # its temporary directory is gone


def test_best_holds_only_the_predictions_this_run_wrote(encoder, tmp_path, capsys):
    # the same fine-tune again after a crash: the earlier run's second dev file's predictions_1.json matched
    # `*predictions*.json` and was copied into this run's best/ as if this model had made it
    out = tmp_path / "out"
    dev, dev2 = _squad(tmp_path / "dev.json", 2), _squad(tmp_path / "dev2.json", 3)
    assert main(_squad_argv(encoder, tmp_path, out, [dev, dev2])) == 0
    assert (out / "best" / "predictions_1.json").is_file()
    (out / "summary.json").unlink()  # as a run stopped before its end leaves it: the same fine-tune goes again
    assert main(_squad_argv(encoder, tmp_path, out, [dev])) == 0
    capsys.readouterr()
    kept = sorted(p.name for p in (out / "best").glob("*.json"))
    assert kept == ["bertforge_finetune.json", "config.json", "nbest_predictions.json", "predictions.json"]


@pytest.mark.parametrize("name", ["predictions.json", "nbest_predictions_1.json", "metrics.png", "tensorboard"])
def test_an_output_path_of_the_wrong_kind_is_refused_before_training(encoder, tmp_path, capsys, name):
    # a directory predictions.json failed the first evaluation (after an epoch), metrics.png the end of the run,
    # a file tensorboard (with train.tensorboard) or a directory metrics.jsonl with a traceback
    out = tmp_path / "out"
    out.mkdir()
    if name == "tensorboard":  # a file where the run makes a directory
        (out / name).write_text("", encoding="utf-8")
    else:
        (out / name).mkdir()
    devs = [_squad(tmp_path / "dev.json", 2), _squad(tmp_path / "dev2.json", 2)]
    argv = _squad_argv(encoder, tmp_path, out, devs)
    assert main([*argv, "--set", "train.tensorboard=true", "--set", "train.plot=true"]) == 2
    one_line(capsys.readouterr().err, f"{out / name} is a", "move it away or choose another train.output_dir")
    assert sorted(p.name for p in out.iterdir()) == [name]  # nothing trained, nothing written


def test_a_nan_evaluation_does_not_replace_the_best_model(encoder, tmp_path, capsys, monkeypatch):
    # STS-B's Pearson correlation of NaN scores is NaN, and `NaN <= best` is false: the NaN model replaced best/
    from bertforge.finetune import metrics

    header = "\t".join(f"c{i}" for i in range(10))
    rows = [f"{i}\tg\tf\t2012\t{i}\ts\ts\tgood film .\tbad plot .\t{i % 5}" for i in range(8)]
    for name in ("train.tsv", "dev.tsv"):
        (tmp_path / name).write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    scores = iter([0.5, float("nan")])  # the first epoch's Pearson, then the second's
    monkeypatch.setitem(metrics.GLUE_METRICS, "pearson", lambda preds, labels: next(scores))
    sets = ["train.global_batch_size=8", "train.micro_batch_size=8", "train.device=cpu", "train.plot=false"]
    sets += ["train.epochs=2", "task.max_seq_len=64"]
    argv = ["finetune", "--task", "stsb", "--model", str(encoder), "--train-file", str(tmp_path / "train.tsv")]
    argv += ["--dev-file", str(tmp_path / "dev.tsv"), "--output-dir", str(tmp_path / "out")]
    assert main([*argv, *(x for s in sets for x in ("--set", s))]) == 0
    best = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["best"]
    assert best["epoch"] == 1 and best["pearson"] == 0.5
    assert runner._improves(0.1, float("nan")) and not runner._improves(float("nan"), 0.1)
