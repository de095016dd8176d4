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


@pytest.mark.parametrize(("name", "make_dir"), [("checkpoints", False), ("metrics.jsonl", True), ("config.yaml", True)])
def test_a_run_output_of_the_wrong_kind_is_refused_before_the_model_is_built(
    shards, overrides, tmp_path, capsys, name, make_dir
):
    """A file where the run writes its checkpoints directory (or a directory where it writes a file) was a
    traceback at the first save, after the training."""
    out = tmp_path / "run"
    out.mkdir()
    (out / name).mkdir() if make_dir else (out / name).write_text("mine")
    assert _pretrain(overrides, shards, out) == 2
    one_line(capsys.readouterr().err, str(out / name), "move it away or choose another train.output_dir")
    assert sorted(p.name for p in out.iterdir()) == [name]


def test_profile_is_checked_against_the_steps_left_before_anything_is_written(shards, overrides, tmp_path, capsys):
    out = tmp_path / "run"
    assert _pretrain(overrides, shards, out, "--profile", "-1") == 2
    one_line(capsys.readouterr().err, "--profile N records N steps; N must be >= 0")
    sets = overrides(shards, out, **{"train.max_steps": 3})
    assert main(["pretrain", "--profile", "5", *(x for s in sets for x in ("--set", s))]) == 2
    one_line(capsys.readouterr().err, "--profile 5 records 5 steps after 1 warm-up step, and this run has 3 left")
    assert not out.exists()
    assert main(["pretrain", "--profile", "2", *(x for s in sets for x in ("--set", s))]) == 0
    assert (out / "profile" / "step_parts.json").is_file()


def test_a_checkpoints_link_to_storage_not_mounted_is_refused_at_start(shards, overrides, tmp_path, capsys):
    """checkpoints/ linked to storage this node has not mounted: the run trained save_every steps, then died at the
    first save."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoints").symlink_to(tmp_path / "not-mounted" / "ckpts")
    assert _pretrain(overrides, shards, out) == 2
    one_line(capsys.readouterr().err, f"{out / 'checkpoints'} is a link to", "which does not exist")
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints"]
