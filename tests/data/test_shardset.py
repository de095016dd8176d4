"""ShardSet: the one reader of a shard directory's format — kinds, listing, manifest, checks, read once."""

from __future__ import annotations

import json
import pickle

import h5py
import numpy as np
import pytest

from bertforge.data.shards import write_manifest, write_shard
from bertforge.data.shardset import NVIDIA_KEYS, PACKED_KEYS, ShardSet, list_shards
from bertforge.errors import UserError


def _nvidia(n: int = 6, S: int = 16, P: int = 4) -> dict[str, np.ndarray]:
    ids = np.arange(n * S, dtype=np.int32).reshape(n, S) % 50 + 1
    return {
        "input_ids": ids,
        "input_mask": np.ones((n, S), np.int8),
        "segment_ids": np.zeros((n, S), np.int8),
        "masked_lm_positions": np.tile(np.arange(1, P + 1, dtype=np.int32), (n, 1)),
        "masked_lm_ids": np.ones((n, P), np.int32),
        "next_sentence_labels": np.zeros(n, np.int8),
    }


def _dynamic(n: int = 6, S: int = 16) -> dict[str, np.ndarray]:
    a = _nvidia(n, S)
    del a["masked_lm_positions"], a["masked_lm_ids"]
    return a


def _packed(n: int = 4, S: int = 16, K: int = 3) -> dict[str, np.ndarray]:
    a = _nvidia(n, S, 6)
    a.update(
        positions=np.zeros((n, S), np.int32),
        next_sentence_positions=np.zeros((n, K), np.int32),
        next_sentence_labels=np.zeros((n, K), np.int8),
        next_sentence_weights=np.ones((n, K), np.int8),
    )
    return a


def _dir(tmp_path, name: str, arrays: dict[str, np.ndarray], shards: int = 2, attrs=None):
    d = tmp_path / name
    for i in range(shards):
        write_shard(d / f"train_{i}.hdf5", arrays, attrs=attrs)
    return d


def test_kinds_schema_keys_and_facts(tmp_path):
    nv = ShardSet.open(_dir(tmp_path, "nv", _nvidia()))
    assert (nv.kind, nv.keys, nv.rows, nv.seq_len, nv.max_pred) == ("nvidia", NVIDIA_KEYS, 12, 16, 4)
    assert nv.vocab_size is None and nv.vocab_file is None and nv.avg_seq_per_sample == 1.0
    dyn = ShardSet.open(
        _dir(
            tmp_path,
            "dyn",
            _dynamic(),
            attrs={"bertforge_kind": "dynamic", "max_pred": 3, "vocab_size": 77, "mask_id": 5, "wwm": True},
        )
    )
    assert (dyn.kind, dyn.max_pred, dyn.vocab_size) == ("dynamic", 3, 77)
    assert dyn.masking_params() == {"max_pred": 3, "mask_id": 5, "wwm": True} and nv.masking_params() == {}
    pd = _dir(tmp_path, "pk", _packed())
    (pd / "packing.json").write_text(json.dumps({"avg_seq_per_sample": 2.5, "vocab_size": 99}))
    pk = ShardSet.open(pd)
    assert (pk.kind, pk.keys, pk.avg_seq_per_sample, pk.vocab_size) == ("packed", PACKED_KEYS, 2.5, 99)
    # packed: an update of 64 sequences is about 64 / 2.5 rows, a multiple of micro x world
    assert pk.rows_per_update(64, 4, 2) == 24 and nv.rows_per_update(64, 4, 2) == 64
    # a single shard file is a set of one
    assert ShardSet.open(pd / "train_1.hdf5").files == (pd / "train_1.hdf5",)


def test_read_once_per_directory(tmp_path, monkeypatch):
    d = _dir(tmp_path, "nv", _nvidia(), shards=3)
    opened = []
    real = h5py.File

    def counting(path, *a, **kw):
        opened.append(str(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(h5py, "File", counting)
    first = ShardSet.open(d)
    assert len(opened) == 3
    assert ShardSet.open(str(d)) is first and ShardSet.open(d / ".." / d.name) is first
    assert len(opened) == 3  # the second and third calls read nothing
    # a rewritten directory is read again
    monkeypatch.setattr(h5py, "File", real)
    write_shard(d / "train_3.hdf5", _nvidia(n=2))
    again = ShardSet.open(d)
    assert again is not first and again.rows == first.rows + 2
    # plain data: cheap to send to DataLoader workers
    assert pickle.loads(pickle.dumps(again)).rows == again.rows


def test_listing_order_and_hidden_temp_files(tmp_path):
    d = tmp_path / "s"
    for i in (10, 2, 1):
        write_shard(d / f"train_{i}.hdf5", _nvidia(n=2))
    (d / ".train_3.tmp-123.hdf5").write_bytes(b"half written")  # a killed writer's temporary file
    (d / "notes.txt").write_text("not a shard")
    assert [p.name for p in list_shards(d)] == ["train_1.hdf5", "train_2.hdf5", "train_10.hdf5"]
    assert ShardSet.open(d).rows == 6


def test_errors_name_the_file(tmp_path):
    with pytest.raises(UserError, match="nope does not exist"):
        ShardSet.open(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no .hdf5 shards in .*empty"):
        ShardSet.open(tmp_path / "empty")
    bad = _dir(tmp_path, "bad", _nvidia(), shards=1)
    (bad / "train_1.hdf5").write_bytes(b"not hdf5")
    with pytest.raises(UserError, match="train_1.hdf5 is not a readable HDF5"):
        ShardSet.open(bad)
    mixed = _dir(tmp_path, "mixed", _nvidia(), shards=1)
    write_shard(mixed / "train_1.hdf5", _dynamic())
    with pytest.raises(UserError, match=r"mix kinds \(train_1.hdf5: dynamic, train_0.hdf5: nvidia\)"):
        ShardSet.open(mixed)
    torn = _nvidia()
    torn["masked_lm_ids"] = torn["masked_lm_ids"][:4]
    write_shard(tmp_path / "torn" / "train_0.hdf5", torn)
    with pytest.raises(UserError, match=r"train_0.hdf5 is truncated or inconsistent.*masked_lm_ids"):
        ShardSet.open(tmp_path / "torn")


def test_incomplete_directory(tmp_path):
    d = _dir(tmp_path, "nv", _nvidia(), shards=2)
    entries = [{"file": f"train_{i}.hdf5", "instances": 6} for i in range(3)]
    write_manifest(d, {"shards": entries, "vocab_size": 60})
    with pytest.raises(UserError, match="train_2.hdf5 is missing"):
        ShardSet.open(d)
    write_manifest(d, {"shards": [{"file": "train_0.hdf5", "instances": 9}, entries[1]], "vocab_size": 60})
    with pytest.raises(UserError, match=r"train_0.hdf5 is truncated \(expected 9 rows, found 6\)"):
        ShardSet.open(d)
    write_manifest(d, {"shards": entries[:2], "vocab_size": 60})
    assert ShardSet.open(d).vocab_size == 60


def test_check_model(tmp_path):
    d = _dir(tmp_path, "nv", _nvidia(S=16), shards=1)
    write_manifest(d, {"vocab_size": 120})
    s = ShardSet.open(d)
    s.check_model(vocab_size=120, max_position_embeddings=16)
    s.check_model(vocab_size=128, max_position_embeddings=512)  # a padded vocab is fine
    with pytest.raises(UserError, match="seq_len 16.*max_position_embeddings 8; set model.max_position_embeddings"):
        s.check_model(vocab_size=120, max_position_embeddings=8)
    with pytest.raises(UserError, match="vocab of 120 tokens.*vocab_size is 100; set model.vocab_size"):
        s.check_model(vocab_size=100, max_position_embeddings=16)


def test_check_compatible(tmp_path):
    train = _dir(tmp_path, "train", _packed(S=16), shards=1)
    write_manifest(train, {"vocab_size": 120, "vocab_sha256": "aa"})
    ev = _dir(tmp_path, "eval", _nvidia(S=16), shards=1)
    write_manifest(ev, {"vocab_size": 120, "vocab_sha256": "aa"})
    ShardSet.open(train).check_compatible(ShardSet.open(ev))  # packed training, unpacked eval: the usual pair
    long = _dir(tmp_path, "long", _nvidia(S=32), shards=1)
    with pytest.raises(UserError, match=r"differ in seq_len \(16 vs 32\)"):
        ShardSet.open(train).check_compatible(ShardSet.open(long))
    write_manifest(ev, {"vocab_size": 130})
    with pytest.raises(UserError, match=r"different vocabs \(120 vs 130"):
        ShardSet.open(train).check_compatible(ShardSet.open(ev))
    write_manifest(ev, {"vocab_size": 120, "vocab_sha256": "bb"})
    with pytest.raises(UserError, match="different vocab files"):
        ShardSet.open(train).check_compatible(ShardSet.open(ev))
