"""Bad files and failed runs in the data commands (issue 20, classes 2, 3, 6, 10): a damaged or inconsistent
shard is one line naming it in `data inspect` and `pack`; a full disk while writing shards is one line and
loses nothing; a killed or failed `data shards`/`prepare`/`pack` leaves nothing behind that a re-run keeps;
`data inspect --plot` says where it wrote and refuses a directory."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from tests.helpers import one_line

import bertforge
from bertforge.cli import main
from bertforge.data import shards as shardio
from bertforge.data.shardset import ShardSet
from bertforge.data.vocab import train_wordpiece

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "river",
    "mountain",
    "forest",
    "city",
    "ocean",
    "valley",
]


def _corpus(path: Path, n_docs: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    docs = [
        "\n".join(
            " ".join(rng.choice(WORDS, rng.integers(4, 20))).capitalize() + "." for _ in range(rng.integers(2, 8))
        )
        for _ in range(n_docs)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    docs = _corpus(d / "docs" / "docs_0.txt", 60)
    train_wordpiece([docs], d / "vocab", vocab_size=60)
    return docs.parent, d / "vocab" / "tokenizer.json"


def _shards_argv(docs: Path, vocab: Path, out: Path, *extra: str) -> list[str]:
    return ["data", "shards", "--docs", str(docs), "--vocab", str(vocab), "--out", str(out), "--seq-len", "32",
            "--max-pred", "4", "--dupe-factor", "2", "--shards", "2", "--workers", "1", *extra]  # fmt: skip


def _hidden(d: Path) -> list[str]:
    return sorted(p.name for p in d.rglob(".*"))


def _flip_chunk(path: Path, dataset: str = "input_ids") -> None:
    """Overwrite bytes in the middle of `dataset`'s first compressed chunk: the metadata stays readable (the
    shard opens and lists), the rows fail to decompress."""
    with h5py.File(path, "r") as f:
        info = f[dataset].id.get_chunk_info(0)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(bytes(16))
        fh.seek(info.byte_offset + info.size // 3)
        fh.write(b"\xff" * 16)


@pytest.fixture
def built(corpus, tmp_path):
    docs, vocab = corpus
    out = tmp_path / "shards"
    assert main(_shards_argv(docs, vocab, out)) == 0
    return out


def test_bit_flipped_shard_is_one_line_in_inspect_and_pack(built, tmp_path, capsys):
    victim = sorted(built.glob("*.hdf5"))[1]
    _flip_chunk(victim)
    capsys.readouterr()
    assert main(["data", "inspect", str(built)]) == 2
    one_line(capsys.readouterr().err, victim, "corrupt")
    out = tmp_path / "packed"
    assert main(["pack", "--in", str(built), "--out", str(out)]) == 2
    one_line(capsys.readouterr().err, victim, "corrupt")
    assert not out.exists()  # the failed pack left no directory behind


def test_truncated_shard_is_one_line_in_inspect_and_pack(built, tmp_path, capsys):
    victim = sorted(built.glob("*.hdf5"))[0]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    capsys.readouterr()
    assert main(["data", "inspect", str(victim)]) == 2
    one_line(capsys.readouterr().err, victim)
    assert main(["pack", "--in", str(built), "--out", str(tmp_path / "packed")]) == 2
    one_line(capsys.readouterr().err, victim)


def test_datasets_disagreeing_in_rows_are_flagged_by_inspect_and_refused_by_pack(tmp_path, capsys):
    d = tmp_path / "odd"
    d.mkdir()
    n, S, P = 10, 16, 3
    arrays = {
        "input_ids": np.full((n, S), 5, np.int32),
        "input_mask": np.ones((n, S), np.int8),
        "segment_ids": np.zeros((n, S), np.int8),
        "masked_lm_positions": np.ones((n, P), np.int32),
        "masked_lm_ids": np.full((n, P), 6, np.int32),
        "next_sentence_labels": np.zeros(n - 3, np.int8),  # 3 rows short
    }
    with h5py.File(d / "shard_0.hdf5", "w") as f:
        for k, v in arrays.items():
            f.create_dataset(k, data=v)
    assert main(["data", "inspect", str(d)]) == 2
    one_line(capsys.readouterr().err, d / "shard_0.hdf5", "next_sentence_labels")
    assert main(["pack", "--in", str(d), "--out", str(tmp_path / "p")]) == 2
    one_line(capsys.readouterr().err, d / "shard_0.hdf5")


def test_a_full_disk_while_writing_shards_is_one_line_and_loses_nothing(corpus, built, monkeypatch, capsys):
    before = {p.name: p.read_bytes() for p in built.iterdir()}
    calls = {"n": 0}
    real = shardio.ShardWriter.write

    def full_disk(self, start, arrays):
        calls["n"] += 1
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shardio.ShardWriter, "write", full_disk)
    docs, vocab = corpus
    capsys.readouterr()
    assert main(_shards_argv(docs, vocab, built, "--seed", "99")) == 2  # other settings: every shard rebuilt
    one_line(capsys.readouterr().err, "no space left", built)
    assert calls["n"] == 1
    assert {p.name: p.read_bytes() for p in built.iterdir()} == before  # the earlier shards and manifest intact
    assert _hidden(built) == []  # neither the temporary shard nor the spill
    monkeypatch.setattr(shardio.ShardWriter, "write", real)


def test_a_full_disk_in_the_one_atomic_writer_removes_the_temporary_file(tmp_path, monkeypatch):
    from bertforge.errors import UserError
    from bertforge.runtime import io

    target = tmp_path / "summary.json"
    target.write_text("old")

    with pytest.raises(UserError, match=f"no space left.*{target.name}"), io.atomic_path(target) as tmp:
        tmp.write_text("partial")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert target.read_text() == "old" and _hidden(tmp_path) == []


def test_a_rerun_removes_what_a_killed_data_shards_left(corpus, tmp_path):
    """A real SIGKILL while the documents are spilled, then a re-run: no spill copy or temporary shard stays."""
    _, vocab = corpus
    big = _corpus(tmp_path / "big" / "docs_0.txt", 30000, seed=3)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(Path(bertforge.__file__).parents[1])}
    child = subprocess.Popen(
        [sys.executable, "-m", "bertforge", *_shards_argv(big.parent, vocab, out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    try:
        while not list(out.glob(".spill*/*")) and child.poll() is None:
            assert time.monotonic() < deadline, "the child never spilled"
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL, "the child finished before it was killed: make the corpus larger"
    assert any(n.startswith(".spill") for n in _hidden(out))  # what a killed run leaves
    (out / ".train_0.tmp-4194304.hdf5").write_bytes(b"half a shard")  # as if killed while writing a shard
    assert main(_shards_argv(big.parent, vocab, out, "--shards", "1")) == 0
    assert _hidden(out) == []
    assert ShardSet.open(out).rows > 0


def test_a_failed_data_shards_leaves_no_directory_and_no_spill(corpus, tmp_path, capsys):
    _, vocab = corpus
    empty = tmp_path / "empty" / "docs_0.txt"
    empty.parent.mkdir()
    empty.write_text("\n\n")
    out = tmp_path / "new" / "shards"
    assert main(_shards_argv(empty.parent, vocab, out)) == 2
    one_line(capsys.readouterr().err, "empty")
    assert not (tmp_path / "new").exists()


def test_a_failed_prepare_and_docs_leave_no_directory(tmp_path, capsys):
    out = tmp_path / "prep"
    argv = ["data", "prepare", "--set", f"output_dir={out}", "--set", f"docs.source={tmp_path / 'missing.txt'}"]
    assert main(argv) == 2
    one_line(capsys.readouterr().err, "missing.txt")
    assert not out.exists()
    assert main(["data", "docs", "--source", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "d")]) == 2
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("vocab.vocab_file=/nonexistent/vocab.txt", "vocab.vocab_file /nonexistent/vocab.txt does not exist"),
        ("shards_subdir=docs", "shards_subdir (docs) is the docs directory"),
        ("shards.seq_len=4", "seq_len"),
    ],
)
def test_prepare_refuses_what_later_steps_would_before_the_documents_step(tmp_path, capsys, setting, message):
    """These were refused only after the documents (and vocab) step: hours of work on a Wikipedia dump."""
    src = tmp_path / "src.txt"
    src.write_text("One sentence of text that is long enough for a document here.\n" * 20)
    out = tmp_path / "prep"
    argv = ["data", "prepare", "--set", f"output_dir={out}", "--set", f"docs.source={src}", "--set", setting]
    assert main(argv) == 2
    one_line(capsys.readouterr().err, message)
    assert not out.exists()


def test_prepare_retrains_the_vocab_when_the_corpus_changes(tmp_path, tiny_corpus, capsys):
    """The vocab was kept ("trained with these settings") after the documents were rebuilt from another corpus."""
    out = tmp_path / "prep"
    other = tmp_path / "other.txt"
    other.write_text(tiny_corpus.read_text().replace("document", "chapter"))
    sets = ["vocab.vocab_size=120", "shards.dupe_factor=1", "shards.eval_fraction=0", "shards.num_shards=1"]
    for source, kept in ((tiny_corpus, False), (tiny_corpus, True), (other, False)):
        argv = ["data", "prepare", "--set", f"output_dir={out}", "--set", f"docs.source={source}"]
        assert main([*argv, *(x for s in sets for x in ("--set", s))]) == 0
        assert ("trained with these settings" in capsys.readouterr().out) is kept


def test_a_rerun_of_pack_removes_a_killed_runs_temporary_shard(built, tmp_path, capsys):
    out = tmp_path / "packed"
    out.mkdir()
    stale = out / ".packed_00000.tmp-4194304.hdf5"  # another process's temporary name (the killed run's)
    stale.write_bytes(b"half a packed shard of a killed run")
    assert main(["pack", "--in", str(built), "--out", str(out)]) == 0
    assert _hidden(out) == [] and ShardSet.open(out).kind == "packed"


def test_inspect_plot_says_where_and_refuses_a_directory(built, tmp_path, capsys):
    png = tmp_path / "plots" / "h.png"
    assert main(["data", "inspect", str(built), "--plot", str(png)]) == 0
    assert f"plot: wrote {png}" in capsys.readouterr().out and png.stat().st_size > 0
    assert main(["data", "inspect", str(built), "--plot", str(tmp_path)]) == 2
    one_line(capsys.readouterr().err, "--plot", "directory")
    assert main(["data", "inspect", str(built), "--json", "--plot", str(png)]) == 0
    assert f"plot: wrote {png}" in capsys.readouterr().err


def test_a_directory_without_manifest_is_named_in_a_warning(built, capsys):
    (built / "manifest.json").unlink()
    ShardSet.open(built)
    err = capsys.readouterr().err
    assert "warning" in err and str(built.resolve()) in err and "manifest.json" in err


def test_a_full_disk_while_writing_document_shards_is_one_line_and_loses_nothing(corpus, tmp_path, monkeypatch, capsys):
    from bertforge.data import documents

    docs, _ = corpus
    out = tmp_path / "docs_out"
    argv = ["data", "docs", "--source", str(docs / "docs_0.txt"), "--out", str(out), "--shards", "2", "--workers", "1"]
    assert main(argv) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full_disk(self, doc):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(documents.ShardWriter, "write", full_disk)
    capsys.readouterr()
    assert main([*argv[:-4], "--shards", "3", "--workers", "1"]) == 2  # other settings: rewritten
    one_line(capsys.readouterr().err, "no space left", out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and _hidden(out) == []


def test_a_real_full_disk_while_writing_shards_is_one_line_without_h5py_noise(corpus, tmp_path, small_tmpfs, capfd):
    _, vocab = corpus
    big = _corpus(tmp_path / "big" / "docs_0.txt", 8000, seed=5)
    disk = small_tmpfs("1m")
    capfd.readouterr()
    assert main(_shards_argv(big.parent, vocab, disk / "shards")) == 2
    err = capfd.readouterr().err
    one_line(err, "no space left", disk / "shards")
    assert list(disk.iterdir()) == []  # no temporary shard, no spill, no empty directory


def test_a_full_disk_while_pack_buckets_rows_is_one_line(built, tmp_path, monkeypatch, capsys):
    from bertforge.data import packing

    def full_disk(path, rows):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(packing, "_append_bucket", full_disk)
    out = tmp_path / "packed"
    assert main(["pack", "--in", str(built), "--out", str(out)]) == 2
    one_line(capsys.readouterr().err, "no space left", out)
