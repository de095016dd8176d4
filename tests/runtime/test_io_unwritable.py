"""Outputs that cannot be written are one line naming the path and the setting that chose it, before any work;
the atomic writer's clean-up never hides the error that stopped it. (Tests run as root: chmod blocks nothing,
so the unwritable places are paths under a regular file, and an injected EROFS.)"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from tests.helpers import one_line

from bertforge.cli import main
from bertforge.errors import UserError
from bertforge.runtime import io as rio


def test_writable_dir_refuses_a_file_and_a_path_under_one(tmp_path):
    f = tmp_path / "f"
    f.write_text("mine")
    with pytest.raises(UserError) as e:
        rio.writable_dir(f, "train.output_dir")
    one_line(str(e.value), f"output directory {f} is a file", "choose another train.output_dir")
    with pytest.raises(UserError) as e:
        rio.writable_dir(f / "run", "--out")
    one_line(str(e.value), f"output directory {f / 'run'} is not writable (Not a directory)", "choose another --out")
    assert f.read_text() == "mine"
    assert rio.writable_dir(tmp_path / "a" / "b", "x").is_dir() and list((tmp_path / "a" / "b").iterdir()) == []


def test_writable_file_refuses_a_directory(tmp_path):
    with pytest.raises(UserError) as e:
        rio.writable_file(tmp_path, "--json-summary")
    one_line(str(e.value), f"--json-summary {tmp_path} is a directory")


def test_a_read_only_filesystem_is_one_line_and_the_clean_up_does_not_mask_it(tmp_path, monkeypatch):
    def read_only(self, *a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    # what a read-only mount does: even unlinking a missing temporary file fails (the old _discard raised that)
    monkeypatch.setattr(Path, "unlink", read_only)
    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(UserError) as e, rio.atomic_dir(tmp_path / "export"):
        pytest.fail("the body must not run")
    one_line(str(e.value), f"cannot write {tmp_path / 'export'} (Read-only file system)", "choose a writable path")
    with pytest.raises(UserError) as e:
        rio.writable_dir(tmp_path / "ro" / "pt", "train.output_dir")
    one_line(str(e.value), "is not writable (Read-only file system); choose another train.output_dir")


def test_atomic_path_under_a_file_is_one_line_and_reading_errors_stay_as_they_are(tmp_path):
    f = tmp_path / "f"
    f.write_text("mine")
    with pytest.raises(UserError) as e:
        rio.write_text(f / "x.json", "{}")
    one_line(str(e.value), f"cannot write {f / 'x.json'} (Not a directory)")
    with pytest.raises(FileNotFoundError), rio.atomic_path(tmp_path / "out.txt"):
        (tmp_path / "missing-input").read_text()  # an input's error is not the output's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_export_to_an_unwritable_out_is_one_line(tiny_encoder_factory, tmp_path, capsys):
    model = tiny_encoder_factory(["alpha", "beta"])
    f = tmp_path / "f"
    f.write_text("mine")
    assert main(["export", "--format", "hf", "--model", str(model), "--out", str(f / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"bertforge export: error: cannot write {f / 'x'} (Not a directory)" in err


def test_dead_temporaries_of_one_output_are_removed_and_nothing_else(tmp_path):
    """A SIGTERM-killed `export` left `.OUT.tmp-PID` (the size of a model) that no later run removed."""
    import os

    from bertforge.runtime.io import remove_dead_temporaries

    dead = 2**22 + 12345  # above any pid_max default: no such process
    for name in (f".ex1.tmp-{dead}", f".ex1.tmp-{os.getpid()}", f".other.tmp-{dead}", f".ex10.tmp-{dead}"):
        (tmp_path / name).mkdir()
    assert [p.name for p in remove_dead_temporaries(tmp_path / "ex1")] == [f".ex1.tmp-{dead}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f".ex1.tmp-{os.getpid()}", f".other.tmp-{dead}", f".ex10.tmp-{dead}"]
    )
