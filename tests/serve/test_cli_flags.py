"""Errors of `bertforge export` and `bertforge serve` name the command-line flag that fixes them, not a Python
keyword argument, on one line."""

from __future__ import annotations

import re

import pytest

from bertforge.cli import main

SERVE = ["serve", "--task", "embed", "--no-warmup"]


@pytest.mark.parametrize(
    "args, flag",
    [
        (["export", "--format", "hf", "--task", "qa"], "--init-head"),  # the encoder has no QA head
        ([*SERVE, "--max-batch", "0"], "--max-batch"),
        ([*SERVE, "--instances", "0"], "--instances"),
        ([*SERVE, "--max-queue-delay-us", "-1"], "--max-queue-delay-us"),
        ([*SERVE, "--max-seq-len", "4"], "--max-seq-len"),
        ([*SERVE, "--max-seq-len", "1024"], "--max-seq-len 512"),  # over the model's 512 positions
        ([*SERVE, "--max-request-bytes", "0"], "--max-request-bytes"),
    ],
    ids=["init-head", "max-batch", "instances", "queue-delay", "seq-len-small", "seq-len-large", "request-bytes"],
)
def test_errors_name_the_flag(encoder_dir, tmp_path, capsys, args, flag):
    argv = [*args, "--model", str(encoder_dir)] + (["--out", str(tmp_path / "out")] if args[0] == "export" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert flag in err and len(err.splitlines()) == 1, err
    assert not re.search(r"(?<![.\w])[a-z]+_[a-z_]+=", err.replace("in Python: allow_missing_head=", "")), err
