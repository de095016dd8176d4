"""`bertforge finetune` shows its progress with a rate and an ETA (training steps and evaluation) and draws
metrics.png of the training loss and the dev metric."""

from __future__ import annotations

import json
import re

from bertforge.cli import main
from bertforge.runtime import progress


def test_finetune_progress_and_plot(encoder, finetune_argv, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(progress, "EVERY_S", 0.0)  # every evaluation batch gets its line
    out = tmp_path / "out"
    argv = finetune_argv(encoder, tmp_path, out, "sst2", "train.epochs=2", "train.eval_batch_size=4")
    assert main([*argv, "--set", "train.plot=true"]) == 0
    text = capsys.readouterr().out
    # training: step lines with throughput and ETA (the metrics logger's)
    assert re.search(r"step 2/8 \(25%\) .*seq/s .*\| eta \dm\d\ds", text), text
    # evaluation: 8 dev rows in batches of 4, with rows/s and an ETA (the shared progress helper)
    assert re.search(r"evaluate dev: 4/8 rows \(50%\) \| [\d.,]+ rows/s \| eta \dm\d\ds", text), text
    png = out / "metrics.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {png}" in text


def test_plot_shows_the_dev_metric(tmp_path, monkeypatch):
    """The PNG's second panel is the dev set's main metric (eval_main), not pre-training's accuracies."""
    import matplotlib.axes

    from bertforge.finetune.runner import plot_finetune

    rows = [{"step": 1, "loss": 0.7}, {"step": 2, "loss": 0.6}, {"step": 2, "eval_main": 0.5, "eval_accuracy": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    drawn, real = [], matplotlib.axes.Axes.plot

    def spy(self, *args, **kw):
        drawn.append([list(a) for a in args])
        return real(self, *args, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    assert plot_finetune(tmp_path / "metrics.jsonl", tmp_path / "m.png", "accuracy") == tmp_path / "m.png"
    assert drawn == [[[1, 2], [0.7, 0.6]], [[2], [0.5]]]  # the loss, then the dev metric
    assert plot_finetune(tmp_path / "none.jsonl", tmp_path / "n.png", "accuracy") is None
