"""`bertforge pretrain` refuses outputs it cannot write in one line, before the model is built, and creates
nothing (tests run as root: the unwritable places are paths under a regular file)."""

from __future__ import annotations

import pytest
from tests.helpers import one_line

from bertforge.cli import main


@pytest.fixture
def a_file(tmp_path):
    f = tmp_path / "f"
    f.write_text("mine")
    return f


def _pretrain(overrides, shards, out, *flags: str) -> int:
    sets = overrides(shards, out, **{"train.max_steps": 1})
    return main(["pretrain", *flags, *(x for s in sets for x in ("--set", s))])


def test_output_dir_that_is_a_file_or_under_one(shards, overrides, a_file, capsys):
    assert _pretrain(overrides, shards, a_file) == 2
    one_line(
        capsys.readouterr().err,
        f"error: output directory {a_file} is a file, not a directory; choose another train.output_dir",
    )
    assert _pretrain(overrides, shards, a_file / "pt") == 2
    one_line(capsys.readouterr().err, f"output directory {a_file / 'pt'} is not writable (Not a directory)")
    assert a_file.read_text() == "mine"


def test_json_summary_that_cannot_be_written(shards, overrides, a_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert _pretrain(overrides, shards, out, "--json-summary", str(a_file / "s.json")) == 2
    one_line(
        capsys.readouterr().err, f"output directory {a_file} is a file, not a directory; choose another --json-summary"
    )
    assert _pretrain(overrides, shards, out, "--json-summary", str(tmp_path)) == 2
    one_line(capsys.readouterr().err, f"--json-summary {tmp_path} is a directory; name a file")
    assert not out.exists()  # refused before train.output_dir was created
