"""Reading shards other tools wrote, and directories as users leave them: NVIDIA's and MLPerf's dtypes and shapes,
Habana's packed shards, zero-row, truncated, non-HDF5, temporary and symlinked files, thousands of shards, and the
loader's cursor over shards of unequal sizes; `bertforge data inspect` on each."""

from __future__ import annotations

import collections
import errno
import json
import os

import h5py
import numpy as np
import pytest

from bertforge.cli import main
from bertforge.data import loader as loader_mod
from bertforge.data.loader import LaneReader, PretrainLoader, eval_batches
from bertforge.data.shards import write_shard
from bertforge.data.shardset import ShardSet, reading
from bertforge.errors import UserError

S, P = 16, 4


def _nvidia(path, n, ids_dtype="i4", mask_dtype="i1", nsp_shape=None, P=P, S=S, compression="gzip", tag=0):
    """A shard as NVIDIA's create_pretraining_data.py writes it (h5py, gzip, its dtypes; `ids_dtype` "i2" and no
    compression: MLPerf's pick_eval_samples.py). Row r of shard `tag`: input_ids[r, 1:3] = (tag + 1, r + 1)."""
    ids = np.zeros((n, S), np.int64)
    mask = np.zeros((n, S), np.int64)
    pos = np.zeros((n, P), np.int64)
    lab = np.zeros((n, P), np.int64)
    for r in range(n):
        length = 6 + r % (S - 6)
        ids[r, :length] = 7
        ids[r, 0], ids[r, 1], ids[r, 2], ids[r, length - 1] = 2, tag + 1, r + 1, 3
        mask[r, :length] = 1
        pos[r, :2] = (1, 2)  # masked_lm_positions padded with 0
        lab[r, :2] = ids[r, 1:3]
    nsp = (np.arange(n) % 2).reshape(nsp_shape or (n,))
    with h5py.File(path, "w") as f:
        for name, arr, dt in (
            ("input_ids", ids, ids_dtype),
            ("input_mask", mask, mask_dtype),
            ("segment_ids", np.zeros((n, S)), "i1"),
            ("masked_lm_positions", pos, ids_dtype),
            ("masked_lm_ids", lab, ids_dtype),
            ("next_sentence_labels", nsp, "i1"),
        ):
            f.create_dataset(name, data=arr, dtype=dt, compression=compression if n else None)


def _loader(d, **kw):
    args = dict(global_batch=4, micro_batch=2, rank=0, world_size=1, seed=1, num_workers=0, vocab_size=100)
    return PretrainLoader.from_dir(d, **{**args, **kw})


@pytest.mark.parametrize(
    "kw",
    [
        {},  # NVIDIA: int32 ids, int8 masks, labels (N,)
        {"ids_dtype": "i8", "mask_dtype": "i8"},  # int64 everywhere
        {"nsp_shape": (10, 1)},  # labels (N, 1)
        {"ids_dtype": "i2", "compression": None},  # MLPerf eval: int16, uncompressed
        {"P": 8},  # a max_pred other than the config's 20: the batch takes the shard's width
    ],
)
def test_writers_dtypes_and_shapes_are_read_as_written(tmp_path, kw, capsys):
    _nvidia(tmp_path / "part_0.hdf5", 10, **kw)
    batch = next(_loader(tmp_path).iterate())
    assert all(v.dtype.is_floating_point is False and v.dtype.itemsize == 8 for v in batch.values())
    assert batch["masked_positions"].shape == (2, kw.get("P", P)) and batch["nsp_labels"].numel() == 2
    assert (batch["masked_labels"][:, :2] == batch["input_ids"][:, 1:3]).all()
    rows = [b for b in eval_batches(tmp_path, 4, vocab_size=100)]
    assert sum(len(b["input_ids"]) for b in rows) == 10
    assert rows[0]["input_ids"][:, 2].tolist() == [1, 2, 3, 4]
    assert main(["data", "inspect", str(tmp_path), "--json"]) == 0
    total = json.loads(capsys.readouterr().out)["total"]
    assert (total["rows"], total["nsp_random_fraction"], total["masked_per_row_mean"]) == (10, 0.5, 2.0)


def _habana_packed(path, n, K=3, S=16, P=6):
    """A packed shard as Habana's pack_pretraining_data_pytorch.py writes it (no packing.json; its dtypes): row r
    holds 1 + r % K sequences of 5 tokens."""
    out = {k: np.zeros((n, S), np.int32) for k in ("input_ids", "input_mask", "segment_ids", "positions")}
    out |= {k: np.zeros((n, P), np.int32) for k in ("masked_lm_positions", "masked_lm_ids")}
    out |= {k: np.zeros((n, K), np.int32) for k in ("next_sentence_positions", "next_sentence_labels")}
    out["next_sentence_weights"] = np.zeros((n, K), np.int32)
    for r in range(n):
        for s in range(1 + r % K):
            a = 5 * s
            out["input_ids"][r, a : a + 5] = (2, 9, 9, 9, 3)
            out["input_mask"][r, a : a + 5] = s + 1
            out["positions"][r, a : a + 5] = np.arange(5)
            out["masked_lm_positions"][r, s], out["masked_lm_ids"][r, s] = a + 1, 9
            out["next_sentence_positions"][r, s], out["next_sentence_weights"][r, s] = a, 1
    dtypes = {"segment_ids": "i1", "next_sentence_labels": "i1"}
    with h5py.File(path, "w") as f:
        for k, v in out.items():
            f.create_dataset(k, data=v, dtype=dtypes.get(k, "i4"), compression="gzip")


def test_habana_packed_shards_without_packing_json_count_their_sequences(tmp_path, capsys):
    """Habana's packer writes no packing.json: avg_seq_per_sample was taken as 1.0, so an update took
    global_batch packs, about twice the sequences asked for."""
    for i in range(2):
        _habana_packed(tmp_path / f"mixed_strategies_part_{i}.hdf5", 30)  # 1, 2, 3 sequences per row: mean 2
    shards = ShardSet.open(tmp_path)
    assert shards.kind == "packed" and shards.avg_seq_per_sample == 2.0
    assert shards.rows_per_update(64, 4, 1) == 32
    batch = next(_loader(tmp_path, global_batch=8, micro_batch=4).iterate())
    assert batch["nsp_labels"].shape == (4, 3) and set(batch["attention_mask"].unique().tolist()) <= {0, 1, 2, 3}
    assert main(["data", "inspect", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"]["avg_seq_per_row"] == 2.0
    (tmp_path / "packing.json").write_text(json.dumps({"avg_seq_per_sample": 1.5}))
    assert ShardSet.open(tmp_path).avg_seq_per_sample == 1.5  # the recorded figure wins


def test_mlperf_varlength_shards_say_which_shards_to_use(tmp_path, capsys):
    """MLPerf's *_varlength shards (convert_fixed2variable.py) store ragged rows and no input_mask: the message said
    "not a pre-training shard"; it now names the format and the fixed-length shards to use instead."""
    with h5py.File(tmp_path / "part_eval_10k.hdf5", "w") as f:
        ids = f.create_dataset("input_ids", (2,), dtype=h5py.vlen_dtype(np.int16))
        ids[0], ids[1] = np.arange(5), np.arange(3)
        f.create_dataset("next_sentence_labels", data=np.zeros(2, np.int8))
    with pytest.raises(UserError, match=r"part_eval_10k.hdf5 holds variable-length rows.*hdf5_\*_shards_uncompressed"):
        ShardSet.open(tmp_path)
    assert main(["data", "inspect", str(tmp_path)]) == 2
    assert "variable-length" in capsys.readouterr().err


def test_two_seq_lens_in_one_directory_name_a_file_of_each(tmp_path, capsys):
    _nvidia(tmp_path / "a.hdf5", 4)
    _nvidia(tmp_path / "b.hdf5", 4, S=32, P=8)
    _nvidia(tmp_path / "c.hdf5", 4)
    assert main(["data", "inspect", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "a.hdf5: 16/4, b.hdf5: 32/8" in err and "one phase" in err


def test_a_symlink_whose_target_is_gone_is_an_error_not_a_missing_shard(tmp_path, capsys):
    """Shards linked from elsewhere are read through their links; a link whose target moved used to be skipped in
    silence (without a manifest, training went on with less data)."""
    store = tmp_path / "store"
    store.mkdir()
    _nvidia(store / "real.hdf5", 6)
    d = tmp_path / "d"
    d.mkdir()
    (d / "part_0.hdf5").symlink_to(store / "real.hdf5")
    assert ShardSet.open(d).rows == 6 and next(_loader(d).iterate())["input_ids"].shape == (2, S)
    (d / "part_1.hdf5").symlink_to(store / "moved.hdf5")
    with pytest.raises(UserError, match=r"part_1.hdf5 is a symlink to .*moved.hdf5, which does not exist"):
        ShardSet.open(d)
    assert main(["data", "inspect", str(d / "part_1.hdf5")]) == 2
    assert "remove the link" in capsys.readouterr().err


def test_zero_row_temporary_truncated_and_foreign_files(tmp_path, capsys):
    d = tmp_path / "d"
    d.mkdir()
    _nvidia(d / "part_0.hdf5", 6)
    _nvidia(d / "part_1.hdf5", 0)  # zero rows: read as none
    _nvidia(d / ".part_2.tmp-123.hdf5", 3)  # our writers' temporary names: skipped
    (d / "part_3.hdf5.tmp").write_bytes(b"")  # other tools' temporary names: not a shard suffix
    assert [p.name for p in ShardSet.open(d).files] == ["part_0.hdf5", "part_1.hdf5"]
    seen = collections.Counter(int(r) for b in eval_batches(d, 4, vocab_size=100) for r in b["input_ids"][:, 2])
    assert seen == {r: 1 for r in range(1, 7)}
    assert main(["data", "inspect", str(d), "--json"]) == 0
    assert [s["rows"] for s in json.loads(capsys.readouterr().out)["shards"]] == [6, 0]
    # a file half copied, or one another program is still writing under its final name
    _nvidia(d / "part_4.hdf5", 500)
    data = (d / "part_4.hdf5").read_bytes()
    (d / "part_4.hdf5").write_bytes(data[: len(data) // 2])
    (d / "part_5.hdf5").write_text("not hdf5")
    for name in ("part_4.hdf5", "part_5.hdf5"):
        assert main(["data", "inspect", str(d / name)]) == 2
        err = capsys.readouterr().err
        assert f"{name} is not a readable HDF5 file" in err and "delete it" in err and "Traceback" not in err


def test_errors_that_are_not_the_files_fault_do_not_say_delete_it(tmp_path):
    """Too many open files (and permissions) were reported as "corrupt or truncated ... delete the file"."""
    emfile = r"cannot open shard x.hdf5: too many open files.*ulimit -n"
    with pytest.raises(UserError, match=emfile) as e, reading("x.hdf5"):
        raise OSError(errno.EMFILE, "Too many open files")
    assert "delete" not in str(e.value)
    with pytest.raises(UserError, match="cannot read shard x.hdf5: permission denied"), reading("x.hdf5"):
        raise OSError(errno.EACCES, "Permission denied")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files in /proc")
def test_the_loader_keeps_a_bounded_number_of_shards_open(tmp_path, monkeypatch):
    """Every shard a lane had read stayed open until the loader closed: over an epoch of NVIDIA's or MLPerf's
    2048-4320 shards, a worker passed the open-file limit and stopped with "corrupt or truncated"."""
    monkeypatch.setattr(loader_mod, "MAX_OPEN_SHARDS", 4)
    arrays = {
        "input_ids": np.full((2, 8), 5, np.int32),
        "input_mask": np.ones((2, 8), np.int8),
        "segment_ids": np.zeros((2, 8), np.int8),
        "masked_lm_positions": np.ones((2, 2), np.int32),
        "masked_lm_ids": np.ones((2, 2), np.int32),
        "next_sentence_labels": np.zeros(2, np.int8),
    }
    for s in range(40):
        write_shard(tmp_path / f"part_{s}.hdf5", arrays)
    before = len(os.listdir("/proc/self/fd"))
    it = _loader(tmp_path).iterate()
    for _ in range(2 * 40):  # two epochs
        next(it)
    assert len(os.listdir("/proc/self/fd")) - before <= 4
    it.close()


def test_every_row_once_per_epoch_across_ranks_and_resume_with_workers(tmp_path):
    """Shards of unequal sizes (a zero-row one too), 1/2/4 ranks: each lane's epoch reads each of its rows once and
    the lanes share none; a resumed stream in 2 worker processes continues the uninterrupted one exactly."""
    sizes = [7, 13, 0, 5, 20, 1, 9]
    for s, n in enumerate(sizes):
        _nvidia(tmp_path / f"part_{s}.hdf5", n, tag=s)
    for world in (1, 2, 4):
        seen: collections.Counter = collections.Counter()
        for rank in range(world):
            spec = _loader(tmp_path, global_batch=8, rank=rank, world_size=world, chunk_rows=4).spec
            for lane in spec.my_lanes:
                r = LaneReader(spec, lane)
                for arrays, i, (_, shard, row) in r.rows(0, r.epoch_rows):
                    assert arrays["input_ids"][i][1:3].tolist() == [shard + 1, row + 1]
                    seen[shard, row] += 1
                r.close()
        assert len(seen) == sum(sizes) and set(seen.values()) == {1}

    def stream(start, n, workers):
        it = _loader(tmp_path, global_batch=8, rank=1, world_size=2, chunk_rows=4, num_workers=workers).iterate(start)
        return [next(it)["input_ids"][:, 1:3].tolist() for _ in range(2 * n)]  # accum 2 micro-batches per update

    assert stream(0, 30, 0)[2 * 17 :] == stream(17, 13, 2)  # past the lanes' epoch ends (14 rows each)
