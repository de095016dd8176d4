"""`bertforge data inspect` on shards it did not write (NVIDIA schema via h5py, padded vocab; packed), and the CLI."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from bertforge.cli import main
from bertforge.data import shards
from bertforge.data.inspect import inspect_paths
from bertforge.data.shardset import ShardSet, list_shards


def _nvidia_shard(path, n=50, seq=32, pred=5, seed=0):
    """Exactly NVIDIA's schema, written with h5py the way their hdf5 writer does (gzip, 'i4'/'i1')."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((n, seq), "i4")
    mask = np.zeros((n, seq), "i1")
    seg = np.zeros((n, seq), "i1")
    pos = np.zeros((n, pred), "i4")
    lab = np.zeros((n, pred), "i4")
    lens = rng.integers(8, seq + 1, n)
    for r, L in enumerate(lens):
        ids[r, :L] = rng.integers(999, 30528, L)  # padded-vocab ids up to 30527
        ids[r, 0], ids[r, L - 1] = 101, 102
        mask[r, :L] = 1
        seg[r, L // 2 : L] = 1
        k = 3 if r % 2 else 2
        pos[r, :k] = np.sort(rng.choice(np.arange(1, L - 1), k, replace=False))
        lab[r, :k] = ids[r, pos[r, :k]]
    ids[0, 5] = 30527
    nsp = (np.arange(n) % 2).astype("i1")
    with h5py.File(path, "w") as f:
        for name, arr in (
            ("input_ids", ids),
            ("input_mask", mask),
            ("segment_ids", seg),
            ("masked_lm_positions", pos),
            ("masked_lm_ids", lab),
            ("next_sentence_labels", nsp),
        ):
            f.create_dataset(name, data=arr, dtype=arr.dtype, compression="gzip")
    return lens


def test_inspect_nvidia_shard(tmp_path):
    lens = _nvidia_shard(tmp_path / "hdf5_shard_0.hdf5")
    assert ShardSet.open(tmp_path / "hdf5_shard_0.hdf5").kind == "nvidia"
    res = inspect_paths([tmp_path])
    t = res["total"]
    assert t["rows"] == t["sequences"] == 50 and t["tokens"] == lens.sum()
    assert t["max_token_id"] == 30527
    assert t["nsp_random_fraction"] == 0.5
    assert t["masked_count_hist"][2] == 25 and t["masked_count_hist"][3] == 25
    assert t["padding_fraction"] == pytest.approx(1 - lens.sum() / (50 * 32), abs=1e-6)
    assert np.array_equal(np.nonzero(t["seq_len_hist"])[0], np.unique(lens))


def test_inspect_packed_shard(tmp_path):
    # two packs: row 0 holds sequences of 5 and 3 tokens, row 1 one of 6 (DESIGN §3.3)
    S = 10
    mask = np.array([[1, 1, 1, 1, 1, 2, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]], np.int8)
    arrays = {
        "input_ids": np.where(mask > 0, 7, 0).astype(np.int32),
        "input_mask": mask,
        "segment_ids": np.zeros((2, S), np.int8),
        "positions": np.array([[0, 1, 2, 3, 4, 0, 1, 2, 0, 0], [0, 1, 2, 3, 4, 5, 0, 0, 0, 0]], np.int32),
        "masked_lm_positions": np.array([[1, 6, 0, 0, 0, 0], [2, 0, 0, 0, 0, 0]], np.int32),
        "masked_lm_ids": np.array([[9, 9, 0, 0, 0, 0], [9, 0, 0, 0, 0, 0]], np.int32),
        "next_sentence_positions": np.array([[0, 5], [0, 0]], np.int32),
        "next_sentence_labels": np.array([[1, 0], [1, 0]], np.int8),
        "next_sentence_weights": np.array([[1, 1], [1, 0]], np.int8),
    }
    shards.write_shard(tmp_path / "packed_0.hdf5", arrays)
    t = inspect_paths([tmp_path / "packed_0.hdf5"])["total"]
    assert t["kinds"] == ["packed"] and t["rows"] == 2 and t["sequences"] == 3 and t["tokens"] == 14
    assert t["seq_len_hist"][5] == 1 and t["seq_len_hist"][3] == 1 and t["seq_len_hist"][6] == 1
    assert t["avg_seq_per_row"] == 1.5 and t["sequences_per_row_hist"] == [0, 1, 1]
    assert t["nsp_random_fraction"] == pytest.approx(2 / 3, abs=1e-6)
    assert t["padding_fraction"] == pytest.approx(0.3)


def test_cli_inspect_json_and_plot(tmp_path, capsys):
    _nvidia_shard(tmp_path / "s.hdf5")
    assert main(["data", "inspect", str(tmp_path / "s.hdf5"), "--json", "--plot", str(tmp_path / "h.png")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total"]["rows"] == 50
    assert (tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["data", "inspect", str(tmp_path / "missing.hdf5")]) == 2
    assert "missing.hdf5" in capsys.readouterr().err
    # a re-run over its own PNG is fine
    assert main(["data", "inspect", str(tmp_path / "s.hdf5"), "--plot", str(tmp_path / "h.png")]) == 0
    capsys.readouterr()


def test_inspect_plot_never_writes_over_a_shard(tmp_path, capsys):
    """`data inspect --plot s/*.hdf5`: the shell makes the first shard the plot's target. It used to be
    overwritten by the PNG; now any non-.png name, and any existing file that is not a PNG, is refused first."""
    _nvidia_shard(tmp_path / "a.hdf5")
    _nvidia_shard(tmp_path / "b.hdf5")
    before = (tmp_path / "a.hdf5").read_bytes()
    assert main(["data", "inspect", "--plot", str(tmp_path / "a.hdf5"), str(tmp_path / "b.hdf5")]) == 2
    assert "ending in .png" in capsys.readouterr().err
    (tmp_path / "x.png").write_bytes(b"not an image")
    assert main(["data", "inspect", str(tmp_path / "b.hdf5"), "--plot", str(tmp_path / "x.png")]) == 2
    assert "is not a PNG" in capsys.readouterr().err
    assert (tmp_path / "a.hdf5").read_bytes() == before and (tmp_path / "x.png").read_bytes() == b"not an image"


def test_cli_chain_and_prepare(tmp_path, tiny_corpus, capsys):
    assert (
        main(
            [
                "data",
                "docs",
                "--source",
                str(tiny_corpus),
                "--out",
                str(tmp_path / "docs"),
                "--min-doc-chars",
                "50",
                "--shards",
                "2",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    assert (
        main(
            ["data", "vocab", "--docs", str(tmp_path / "docs"), "--out", str(tmp_path / "vocab"), "--vocab-size", "150"]
        )
        == 0
    )
    assert (
        main(
            [
                "data",
                "shards",
                "--docs",
                str(tmp_path / "docs"),
                "--vocab",
                str(tmp_path / "vocab"),
                "--out",
                str(tmp_path / "sh"),
                "--seq-len",
                "32",
                "--max-pred",
                "5",
                "--dupe-factor",
                "2",
                "--shards",
                "2",
                "--dynamic-masking",
            ]
        )
        == 0
    )
    assert [ShardSet.open(p).kind for p in list_shards(tmp_path / "sh")] == ["dynamic", "dynamic"]
    assert (
        main(
            [
                "data",
                "shards",
                "--docs",
                str(tmp_path / "docs"),
                "--vocab",
                str(tmp_path / "vocab"),
                "--out",
                str(tmp_path / "bad"),
                "--seq-len",
                "4",
            ]
        )
        == 2
    )
    assert "seq-len" in capsys.readouterr().err
    out = tmp_path / "prep"
    assert (
        main(
            [
                "data",
                "prepare",
                "--config",
                "demo",
                "--set",
                f"output_dir={out}",
                "--set",
                f"docs.source={tiny_corpus}",
                "--set",
                "docs.min_doc_chars=50",
                "--set",
                "vocab.vocab_size=150",
                "--set",
                "shards.eval_fraction=0.3",
                "--set",
                "shards.dupe_factor=2",
            ]
        )
        == 0
    )
    assert (out / "vocab" / "vocab.txt").is_file() and (out / "vocab" / "tokenizer.json").is_file()
    assert len(list_shards(out / "shards")) == 4 and len(list_shards(out / "eval")) == 1
    man = json.loads((out / "shards" / "manifest.json").read_text())
    assert man["split"] == "train" and man["instances"] > 0
    # a re-run keeps the vocab; another vocab size retrains it (and the shards follow the new vocab)
    sets = [f"output_dir={out}", f"docs.source={tiny_corpus}", "docs.min_doc_chars=50", "shards.eval_fraction=0.3"]
    again = ["data", "prepare", "--config", "demo", *(x for s in [*sets, "shards.dupe_factor=2"] for x in ("--set", s))]
    capsys.readouterr()
    assert main([*again, "--set", "vocab.vocab_size=150"]) == 0
    assert "trained with these settings" in capsys.readouterr().out
    assert main([*again, "--set", "vocab.vocab_size=120"]) == 0
    assert len((out / "vocab" / "vocab.txt").read_text().splitlines()) <= 120
    assert json.loads((out / "vocab" / "trained_with.json").read_text())["vocab_size"] == 120
    # a BPE vocab trained into a WordPiece vocab's directory leaves no stale vocab.txt beside it
    bpe = ["data", "vocab", "--docs", str(tmp_path / "docs"), "--out", str(tmp_path / "vocab"), "--model", "bpe"]
    assert main([*bpe, "--vocab-size", "320"]) == 0
    assert not (tmp_path / "vocab" / "vocab.txt").exists()


@pytest.mark.slow
def test_demo_prepare_end_to_end(tmp_path):
    """The real demo preset (builtin:python-docs, 8000-piece vocab)."""
    assert main(["data", "prepare", "--config", "demo", "--set", f"output_dir={tmp_path}"]) == 0
    t = inspect_paths([tmp_path / "shards"])["total"]
    assert t["rows"] > 5000 and 0.4 < t["nsp_random_fraction"] < 0.65
    assert inspect_paths([tmp_path / "eval"])["total"]["rows"] > 0
